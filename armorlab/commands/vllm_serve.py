"""`armorlab vllm-serve`: start the vLLM server for ``vllm_mode: server`` / ``ref_vllm_mode: server``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("vllm-serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def vllm_serve(
        ctx: typer.Context,
        model: str = typer.Option(..., "--model", help="Model directory or hub id to serve (the policy's start)."),
        host: str = typer.Option("0.0.0.0", "--host", help="Address to listen on (TRL's default)."),
        port: int = typer.Option(8000, "--port", help="Port to listen on."),
        dtype: str = typer.Option("auto", "--dtype", help="vLLM dtype (float32 to match an fp32 trainer)."),
    ) -> None:
        """Run a vLLM server the trainer can generate from and push weights to (foreground).

        Arguments after `--` go to vLLM unchanged. Ready when GET http://HOST:PORT/health answers 200.
        """
        from armorlab.vllm.serve import serve

        serve(model, host=host, port=port, dtype=dtype, extra=list(ctx.args))

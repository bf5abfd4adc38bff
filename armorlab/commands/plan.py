"""`armorlab plan`: the per-GPU memory plan of a run config or of every run of a sweep spec, on a
profile's GPUs (docs/memory-plan.md). Nothing is loaded: the model's shape comes from its config.json.
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(
        config: Path = typer.Argument(..., help="A run config YAML or a sweep spec (sweeps/*.yaml)."),
        profile: Path = typer.Option(None, "--profile", "-p", help="Cluster profile YAML (slurm/*.yaml): its "
                                     "accelerate config and gpu_memory_gb; default: the spec's `profile:`."),
        set_: list[str] = typer.Option([], "--set", help="Override a key of every run, e.g. --set "
                                       "model=Qwen/Qwen3-8B-Base"),
        prompt_tokens: int = typer.Option(None, "--prompt-tokens", min=1, help="Prompt length the plan "
                                          "assumes (prompts are not bounded by the config); default 512."),
    ) -> None:
        """Memory per GPU of each distinct run: weights, optimiser, π_ref, activations, KV cache, engines."""
        from rich.console import Console

        from armorlab.core.plan_inputs import DEFAULT_PROMPT_TOKENS
        from armorlab.errors import ArmorLabError

        groups, where = plans_of(config, profile, set_, prompt_tokens or DEFAULT_PROMPT_TOKENS)
        console = Console(width=max(Console().width, 140))
        refused = []
        for memory, labels in groups:
            console.print(table(memory, labels, where))
            console.print()
            why = memory.overflow()
            if why:
                refused.append(f"memory plan of {labels[0]}" + (f" (and {len(labels) - 1} more runs)" if len(labels) > 1
                                                                else "") + f": {why}")
        if refused:  # said once, every refused plan with its reasons (the tables mark them "does not fit")
            memory = next(m for m, _ in groups if m.overflow())
            raise ArmorLabError("\n".join(refused), key="gpu_memory_gb", value=round(memory.gpu_bytes / 2**30, 1),
                                file=where)


def plans_of(path: Path, profile_path: Path | None, overrides: list[str], prompt_tokens: int):
    """[(plan, [labels of the runs it covers])] and the profile's file, for a run config or a spec.
    Model and data paths are not checked: a paper spec plans as written, before its files exist."""
    import copy

    from armorlab.core.config import (
        deep_merge,
        get_dotted,
        load_yaml_mapping,
        parse_overrides,
        resolve,
        set_dotted,
    )
    from armorlab.core.plan_inputs import gpu_bytes_from_profile, parallelism_from_profile, plan_config
    from armorlab.sweeps.profile import load_profile
    from armorlab.sweeps.spec import load_spec, points

    raw = load_yaml_mapping(path)
    over = parse_overrides(overrides)
    is_spec = isinstance(raw.get("name"), str) and any(k in raw for k in ("base", "grid", "include", "seeds"))
    if is_spec:
        spec = load_spec(path)
        configs = []
        for st in spec.stage_list():  # every stage: a continuing stage's arms have shapes of their own
            base = deep_merge(deep_merge(spec.base, st.base) if st.base else spec.base, over)
            if st.parent is not None:  # its weights' source changes no shape: a placeholder parent
                base["init_from"] = {"run": f"{spec.name}/{'0' * 12}", "select": dict(st.parent.select)}
            for _, point in points(st):
                run = copy.deepcopy(base)
                for key, value in point.items():
                    set_dotted(run, key, copy.deepcopy(value), file=spec.file)
                cfg = resolve(run, file=spec.file, check_paths=False)
                if any(all(get_dotted(cfg, k) == v for k, v in ex.items()) for ex in st.exclude):
                    continue
                label = _label(point)
                configs.append((label if spec.stages is None else f"{st.name}: {label}", cfg))
        profile_path = profile_path or spec.profile_path()
    else:
        configs = [(path.name, resolve(deep_merge(raw, over), file=str(path), check_paths=False))]
    prof = load_profile(profile_path)
    par, gpu = parallelism_from_profile(prof), gpu_bytes_from_profile(prof)
    where = str(profile_path) if profile_path else "the default profile (one process, no GPU size)"
    groups: dict[tuple, tuple] = {}
    for label, cfg in configs:
        memory = plan_config(cfg, par, gpu, prompt_tokens=prompt_tokens, file=str(path))
        key = (memory.shape.name, tuple((x.label, x.bytes) for x in memory.resident),
               tuple((p.label, p.bytes) for p in memory.phases))
        groups.setdefault(key, (memory, []))[1].append(label)
    return list(groups.values()), where


def _label(point: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "base"


def _short(source: str) -> str:
    """A path under the working directory, relative to it."""
    import os

    try:
        rel = os.path.relpath(source)
    except ValueError:
        return source
    return source if rel.startswith("..") or not os.path.exists(source) else rel


def _gib(n: int) -> str:
    gib = n / 2**30
    return f"{gib:.1f}" if gib >= 0.95 or gib == 0 else f"{gib:.2g}"


def table(memory, labels: list[str], where: str):
    """The rich table of one plan: resident lines, then each phase with its peak (resident + phase)."""
    from rich.table import Table

    s, par, gpu = memory.shape, memory.parallel, memory.gpu_bytes
    runs = labels[0] if len(labels) == 1 else f"{len(labels)} runs: {'; '.join(labels[:4])}" + (
        " ..." if len(labels) > 4 else "")
    params = f"{s.params / 1e9:.2f} B" if s.params >= 1e8 else f"{s.params / 1e6:.2f} M"
    title = (f"memory per GPU — {s.name} ({params} params; shapes from {_short(s.source)})\n"
             f"{par.kind} × {par.processes} ({_short(par.source)}), GPU {'%.0f GiB' % (gpu / 2**30) if gpu else 'size unknown'}"
             f" · {runs}")
    t = Table(title=title, title_justify="left", show_lines=False)
    t.add_column("line", overflow="fold")
    t.add_column("GiB", justify="right")
    t.add_column("peak GiB", justify="right")
    t.add_column("how", overflow="fold", style="dim")
    for line in memory.resident:
        t.add_row(line.label, _gib(line.bytes), "", line.note)
    t.add_row("[bold]resident[/]", f"[bold]{_gib(memory.resident_bytes)}[/]", "", "held for the whole run")
    peak = memory.peak_phase
    for phase in memory.phases:
        total = memory.resident_bytes + phase.bytes
        over = gpu is not None and total > gpu
        mark = "red" if over else "bold" if phase is peak else ""
        shown = f"[{mark}]{_gib(total)}[/]" if mark else _gib(total)
        t.add_row(f"[italic]{phase.label}[/]", _gib(phase.bytes), shown, "resident + this")
        for line in phase.lines:
            t.add_row(f"  {line.label}", _gib(line.bytes), "", line.note)
    for label, needs, share, _ in memory.engines:
        mark = "red" if needs > share else ""
        t.add_row(f"{label}: needs / share", _gib(needs), f"[{mark}]{_gib(share)}[/]" if mark else _gib(share),
                  "weights + profile activations + one max-length sequence of KV cache")
    for key, now, fits in memory.engine_shares():
        t.add_row(f"{key}: now / largest that fits", f"{now:g}", f"{fits:g}",
                  "the memory the rest of the run leaves the engine (allowances included)")
    verdict = ("fits" if memory.overflow() is None else "[red]does not fit[/]") if gpu else "not checked: no gpu_memory_gb"
    t.add_row("[bold]peak[/]", "", f"[bold]{_gib(memory.peak_bytes)}[/]",
              f"{peak.label if peak else 'resident'}; {verdict}")
    return t

"""The per-GPU memory plan of a run: what each part of training holds, from the model's shape and
the run's settings, without loading anything (torch-free; ``armorlab plan`` prints it, ``sweep``
and ``train`` refuse a run that does not fit before anything is submitted or loaded).

Every size is a pure function of shapes and byte counts, one formula per function, its source in
the docstring (docs/memory-plan.md lists them with the assumptions). A plan is a list of *resident*
lines (held for the whole run: weights, gradients, optimiser state, π_ref, engines that never
sleep) and *phases* (what one step of the run adds on top, one at a time: a training micro-batch,
scoring, a generation, validation, the exact-KL probe, a reset, a weight push). The peak is the
resident total plus the largest phase; a phase over the GPU's memory is refused with the line that
dominates it and what would make it fit.

Shapes and settings come in as plain values (:class:`ModelShape`, :class:`Parallelism`,
:class:`RunMemory`); armorlab.core.plan_inputs builds them from a config.json, a profile's
accelerate config and a resolved run config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from armorlab.errors import ArmorLabError

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# TRL 1.16's fused log-prob head (trl/kernels/chunked_logprob.py): the LM head is projected in tiles
# of TOKEN_CHUNK_SIZE tokens × _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary columns (trl/trainer/utils.py);
# the (tokens, vocab) logits never exist in full.
TRL_TOKEN_TILE = 4096
TRL_VOCAB_TILE = 32768
# On devices without Triton (CPU) TRL folds each tile with torch ops instead of a kernel. Bytes per
# logit of a tile that the fold holds at once: the backward's (_backward_tile) 7 float32 tensors
# (scaled logits, z, log p, p, the gradient, the two temporaries of its update) + the boolean
# target mask; the forward's (_forward_tile) 3 float32 (z, exp(z − max), e·z for the entropy).
TORCH_FOLD_BACKWARD_BYTES = 7 * 4 + 1
TORCH_FOLD_FORWARD_BYTES = 3 * 4
# TRL's colocated policy engine: LLM(..., max_num_batched_tokens=4096) (trl/generation/vllm_generation.py)
VLLM_BATCHED_TOKENS = 4096
VLLM_DEFAULT_MAX_SEQS = 256  # vLLM's default max_num_seqs (the π_ref engine sets none)
# Assumptions (docs/memory-plan.md): CUDA context + NCCL buffers per process, and per vLLM engine
# the CUDA graphs and non-torch allocations its start-up profile leaves outside the KV cache.
CUDA_CONTEXT_BYTES = 3 * GIB // 2
VLLM_GRAPH_BYTES = 1 * GIB
# Allowances, our choices until a GPU run measures them (benchmarks/gpu/acceptance.py compares the
# plan's peak with torch.cuda.max_memory_reserved): the caching allocator's reserved-but-free blocks
# as a share of the GPU, and what a sleeping vLLM engine keeps of its share (vLLM's sleep-mode docs:
# sleep frees "up to 90%+" of the engine's memory).
FRAGMENTATION_SHARE = 0.05
SLEEP_LEFTOVER_SHARE = 0.10


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class ModelShape:
    """The config.json fields the plan reads (a Llama/Qwen2/Qwen3-style decoder)."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False      # Qwen2: biases on q/k/v
    qk_norm: bool = False       # Qwen3: RMSNorm over each head of q and k
    max_positions: int = 4096
    dtype: str = "bfloat16"     # the checkpoint's torch_dtype
    source: str = ""

    @property
    def layer_params(self) -> int:
        return layer_parameter_count(self)

    @property
    def params(self) -> int:
        return parameter_count(self)

    @property
    def largest_param(self) -> int:
        """Elements of the largest single parameter (what a one-parameter-at-a-time push holds)."""
        d, q = self.hidden_size, self.num_heads * self.head_dim
        return max(self.vocab_size * d, self.intermediate_size * d, q * d)


@dataclass(frozen=True)
class Parallelism:
    """How the training processes share the model (from the profile's accelerate config)."""

    kind: str = "single"        # single | ddp | fsdp | zero1 | zero2 | zero3
    processes: int = 1
    offload: bool = False       # FSDP CPU offload of parameters, gradients and optimiser state
    mixed_precision: str = "no"  # the accelerate config's: no | bf16 | fp16
    source: str = "one process"

    @property
    def shards_params(self) -> bool:
        return self.kind in ("fsdp", "zero3")


@dataclass(frozen=True)
class RunMemory:
    """The run settings that size memory (armorlab.core.plan_inputs.run_memory reads a config)."""

    load_dtype: str = "float32"          # model_init_kwargs dtype (TRL loads float32 by default)
    compute_dtype: str = "bfloat16"      # autocast dtype (bf16/fp16), else the weights'
    train_rows: int = 8                  # per_device_train_batch_size
    prompt_tokens: int = 512
    completion_tokens: int = 1024        # max_completion_length
    gradient_checkpointing: bool = True
    generation_rows: int = 64            # rows of one HF generate of the rollout (per process)
    eval_rows: int = 8                   # per_device_eval_batch_size: validation/anchor/probe chunks
    anchor_draws: int = 4                # rows per prompt in one anchor call: k (one round), else the largest round
    cast_lm_head_to_fp32: bool = False
    optimizer: str = "adamw_torch_fused"
    reference: bool = True               # π_ref is held (armorlab.train.reference.reference_needed)
    resets: bool = False
    anchors: bool = False                # anchor or anchor_gate: π_ref samples every generation
    validation: bool = True
    probe: bool = False                  # the exact-KL probe runs at validation
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_share: float = 0.3              # vllm_gpu_memory_utilization
    vllm_sleep: bool = False
    vllm_tp: int = 1
    vllm_max_len: int | None = None      # vllm_max_model_length (None: the model's)
    vllm_max_seqs: int = VLLM_DEFAULT_MAX_SEQS
    ref_vllm_mode: str = "none"
    ref_vllm_share: float = 0.2
    ref_vllm_dtype: str = "bfloat16"
    ref_vllm_tp: int = 1

    @property
    def seq_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# --------------------------------------------------------------------------- formulas: the model
def layer_parameter_count(s: ModelShape) -> int:
    """Parameters of one decoder layer: q/k/v/o projections (+ q/k/v biases for Qwen2, + the
    per-head q/k RMSNorm weights for Qwen3), the SwiGLU MLP's gate/up/down and two RMSNorms —
    the module shapes of transformers' LlamaDecoderLayer / Qwen2DecoderLayer / Qwen3DecoderLayer."""
    d, q, kv = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if s.qkv_bias else 0) + (2 * s.head_dim if s.qk_norm else 0)
    return attn + 3 * d * s.intermediate_size + 2 * d


def parameter_count(s: ModelShape) -> int:
    """All parameters: embedding V·d, the layers, the final norm d and (untied) the LM head V·d."""
    head = 0 if s.tie_word_embeddings else s.vocab_size * s.hidden_size
    return s.vocab_size * s.hidden_size + s.num_layers * layer_parameter_count(s) + s.hidden_size + head


def adamw_state_bytes(params: int, state_bytes: int) -> int:
    """AdamW's two moments per parameter (Kingma & Ba 2015, Alg. 1: m and v), each in the
    parameter's dtype as torch.optim.AdamW keeps them; the ZeRO paper (Rajbhandari et al. 2020,
    §3.1) counts the same 2 × 4 bytes for fp32 moments (its K = 12 adds the fp32 master copy)."""
    return 2 * params * state_bytes


def ddp_bucket_bytes(params: int, grad_bytes: int) -> int:
    """DistributedDataParallel's gradient buckets: a second copy of every gradient unless
    ``gradient_as_bucket_view`` (off by default; torch.nn.parallel.DistributedDataParallel docs:
    "the saved memory size will be equal to the total gradients size")."""
    return params * grad_bytes


# --------------------------------------------------------------------------- formulas: activations
def layer_activation_bytes(s: ModelShape, b: int) -> int:
    """Bytes one decoder layer saves for backward per token, activations in ``b``-byte dtype.

    Counted from the tensors autograd keeps in transformers' Llama/Qwen layer, as Korthikanti et
    al. 2022 (§4.1) count them for GPT: each RMSNorm keeps its float32 input copy, the normalised
    tensor and its output ((4 + 2b)·d); attention keeps q, k and v repeated to every head (the SDPA
    path with a padding mask repeats k/v) and the output (4·heads·head_dim·b; the SDPA
    memory-efficient/flash kernels keep no heads × s² scores); Qwen3's q/k norms add theirs; the
    SwiGLU MLP keeps gate, silu(gate), up and their product (4·I·b)."""
    d, q, kv = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    norms = 2 * (4 + 2 * b) * d
    qk_norms = (4 + 2 * b) * (q + kv) if s.qk_norm else 0
    return norms + 4 * q * b + qk_norms + 4 * s.intermediate_size * b


def layer_backward_bytes(s: ModelShape, b: int) -> int:
    """Per token, the gradients alive while one layer runs backward: the MLP's (gradients of the
    product, of silu(gate), of up and of gate: 3·I·b at once) and the residual stream's (4·d·b)."""
    return (3 * s.intermediate_size + 4 * s.hidden_size) * b


def attention_mask_bytes(rows: int, seq: int) -> int:
    """The (rows, 1, seq, seq) boolean mask transformers builds for SDPA when a batch is padded."""
    return rows * seq * seq


def training_activation_bytes(s: ModelShape, tokens: int, b: int, checkpointing: bool) -> int:
    """Activations a training micro-batch of ``tokens`` holds after its forward. With gradient
    checkpointing each layer keeps only its input (Chen et al. 2016: √-memory checkpointing, here
    one checkpoint per layer: L·d·b per token); without it every layer keeps
    :func:`layer_activation_bytes`. Plus the final norm's tensors and the LM head's input copy."""
    per_layer = s.hidden_size * b if checkpointing else layer_activation_bytes(s, b)
    return tokens * (s.num_layers * per_layer + (4 + 2 * b) * s.hidden_size + s.hidden_size * b)


def backward_peak_bytes(s: ModelShape, tokens: int, b: int, checkpointing: bool) -> int:
    """What the backward of the layers adds to the stored activations at its peak: with
    checkpointing one layer is recomputed (its :func:`layer_activation_bytes`), and that layer's
    gradients (:func:`layer_backward_bytes`) are alive."""
    recompute = layer_activation_bytes(s, b) if checkpointing else 0
    return tokens * (recompute + layer_backward_bytes(s, b))


def logprob_tile_bytes(tokens: int, vocab: int, b: int, *, triton: bool = True, backward: bool = False) -> int:
    """TRL 1.16's fused LM head holds one projection buffer of min(tokens, 4096) × 32768 logits in
    the compute dtype (trl/kernels/chunked_logprob.py allocates the full tile width), never the
    (tokens, V) logits; without Triton (CPU) the torch fold of each tile adds its temporaries
    (:data:`TORCH_FOLD_FORWARD_BYTES` / :data:`TORCH_FOLD_BACKWARD_BYTES` per logit)."""
    rows = min(tokens, TRL_TOKEN_TILE)
    per_cell = 0 if triton else TORCH_FOLD_BACKWARD_BYTES if backward else TORCH_FOLD_FORWARD_BYTES
    return rows * TRL_VOCAB_TILE * b + rows * min(vocab, TRL_VOCAB_TILE) * per_cell


def fused_head_backward_bytes(tokens: int, vocab: int, hidden: int, b: int, weight_bytes: int) -> int:
    """The fused head's backward accumulates the gradients of its input (tokens·d) and of the LM
    head's weight (V·d) in float32 and casts them back to their tensors' dtypes on return
    (ChunkedLogProbFunction.backward; a cast to float32 is no copy)."""
    def cast(nbytes: int) -> int:
        return 4 + (nbytes if nbytes != 4 else 0)

    return tokens * hidden * cast(b) + vocab * hidden * cast(weight_bytes)


def forward_no_grad_bytes(s: ModelShape, tokens: int, b: int) -> int:
    """A forward without gradients frees each layer's tensors as it goes: at most one layer's MLP
    (gate, silu(gate), up: 3·I·b) and the residual stream in and out (4·d·b) per token."""
    return tokens * (3 * s.intermediate_size + 4 * s.hidden_size) * b


# --------------------------------------------------------------------------- formulas: generation
def kv_cache_bytes(s: ModelShape, tokens: int, b: int) -> int:
    """Key and value vectors of every layer for ``tokens`` tokens: 2 × layers × kv_heads × head_dim
    × tokens × b (HF's DynamicCache and vLLM's paged cache store the same vectors)."""
    return 2 * s.num_layers * s.num_kv_heads * s.head_dim * tokens * b


def sampling_bytes(rows: int, vocab: int) -> int:
    """One decoding step's sampling in HF ``generate``: the last position's logits cast to float32
    and the logits processors' copies (temperature, min_new_tokens, top-p's sorted values and int64
    indices, softmax, cumulative sum, masks, the filtered scores, the probabilities): 46 bytes per
    row per vocabulary entry, as counted on CPU with temperature, min_new_tokens and top-p."""
    return rows * vocab * 46


def generate_bytes(s: ModelShape, rows: int, prompt: int, new: int, b: int) -> int:
    """One HF ``generate`` of ``rows`` rows: the larger of the prefill (the prompts' KV cache, one
    layer's no-grad activations over every prompt token, the last position's logits) and the last
    decoding step (the full KV cache, one layer's more while DynamicCache concatenates, the sampling)."""
    seq = prompt + new
    prefill = (kv_cache_bytes(s, rows * prompt, b) + forward_no_grad_bytes(s, rows * prompt, b)
               + attention_mask_bytes(rows, prompt) + rows * s.vocab_size * 4)
    decode = (kv_cache_bytes(s, rows * seq, b) * (s.num_layers + 1) // s.num_layers
              + attention_mask_bytes(rows, seq) + sampling_bytes(rows, s.vocab_size))
    return max(prefill, decode)


def probe_kl_bytes(rows: int, completion: int, vocab: int, b: int) -> int:
    """The exact-KL probe's sum over a chunk of ``rows`` rows (armorlab.train.evaluation
    .sequence_exact_kl): both models' completion logits (2·b per cell) and, while the KL is summed,
    log_softmax of each in float32, p = exp(log p), log p − log q, p·(log p − log q), the zeros and
    the result of the ``where`` (7 float32 per cell) and its p > 0 mask (1): 2b + 29 bytes per
    row·token·vocabulary cell."""
    return rows * completion * vocab * (2 * b + 29)


def probe_chunk_bytes(s: ModelShape, rows: int, prompt: int, completion: int, b: int) -> int:
    """The probe's peak on one chunk: the larger of the second model's forward (the first one's
    completion logits kept, one layer's no-grad activations, the LM head's logits for the
    completion positions) and the KL sum (:func:`probe_kl_bytes`)."""
    forward = (rows * completion * s.vocab_size * b + forward_no_grad_bytes(s, rows * (prompt + completion), b)
               + rows * (completion + 1) * s.vocab_size * b)
    return max(forward, probe_kl_bytes(rows, completion, s.vocab_size, b))


def vllm_engine_bytes(share: float, gpu_bytes: int) -> int:
    """A vLLM engine takes ``gpu_memory_utilization`` × the GPU's total memory for its weights,
    activation peak and KV cache (vLLM docs, EngineArgs: "the fraction of GPU memory to be used
    for the model executor"; checked against the free memory when it starts)."""
    return int(share * gpu_bytes)


def fragmentation_bytes(gpu_bytes: int) -> int:
    """(M1) The allocator's fragmentation allowance: FRAGMENTATION_SHARE of the GPU."""
    return int(FRAGMENTATION_SHARE * gpu_bytes)


def sleep_leftover_bytes(share: float, gpu_bytes: int) -> int:
    """(M2) What a sleeping engine keeps on the GPU: SLEEP_LEFTOVER_SHARE of its share."""
    return int(SLEEP_LEFTOVER_SHARE * vllm_engine_bytes(share, gpu_bytes))


def vllm_overhead_bytes(s: ModelShape, max_seqs: int, b: int) -> int:
    """What a vLLM engine's start-up profile sets aside besides weights and KV cache: one layer's
    activations for max_num_batched_tokens tokens, the sampler's float32 logits and probabilities
    for max_num_seqs rows, and :data:`VLLM_GRAPH_BYTES` for CUDA graphs (an estimate)."""
    return (forward_no_grad_bytes(s, VLLM_BATCHED_TOKENS, b) + 2 * max_seqs * s.vocab_size * 4
            + VLLM_GRAPH_BYTES)


def fsdp_unit_bytes(s: ModelShape, b: int, *, grads: bool) -> int:
    """FSDP2 all-gathers one wrapped unit at a time in the mixed-precision dtype, the next one
    prefetched (2 decoder layers), and accelerate keeps its tail unit (final norm + LM head) gathered
    from forward to backward (utils/fsdp_utils.py: reshard_after_forward False); in backward each
    gathered unit also has its unsharded gradient."""
    gathered = (2 * s.layer_params + s.vocab_size * s.hidden_size) * b
    return gathered * (2 if grads else 1)


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Line:
    key: str
    label: str
    bytes: int
    note: str = ""
    fix: str = ""


@dataclass(frozen=True)
class Phase:
    key: str
    label: str
    lines: tuple[Line, ...]

    @property
    def bytes(self) -> int:
        return sum(line.bytes for line in self.lines)

    def main_line(self) -> Line:
        return max(self.lines, key=lambda line: line.bytes)


@dataclass
class MemoryPlan:
    shape: ModelShape
    parallel: Parallelism
    run: RunMemory
    gpu_bytes: int | None
    resident: list[Line] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    engines: list[tuple[str, int, int, str]] = field(default_factory=list)  # (label, needs, share, fix)

    @property
    def resident_bytes(self) -> int:
        return sum(line.bytes for line in self.resident)

    @property
    def peak_phase(self) -> Phase | None:
        return max(self.phases, key=lambda p: p.bytes, default=None)

    @property
    def peak_bytes(self) -> int:
        peak = self.peak_phase
        return self.resident_bytes + (peak.bytes if peak is not None else 0)

    def overflow(self) -> str | None:
        """Why the plan does not fit on the GPU (None when it fits or no GPU size is known): every
        engine and phase over its limit, the resident line that overflows first, each with its fix."""
        if self.gpu_bytes is None:
            return None
        gpu = gib(self.gpu_bytes)
        why = [f"{label} needs {gib(needs)} GiB (weights, profile activations, one sequence of KV cache) but its "
               f"share is {gib(share)} GiB of the {gpu} GiB GPU. To fit: {fix}"
               for label, needs, share, fix in self.engines if needs > share]
        running = 0
        for line in self.resident:
            running += line.bytes
            if running > self.gpu_bytes:
                why.append(f"'{line.label}' takes the resident memory to {gib(running)} GiB per GPU, over the GPU's "
                           f"{gpu} GiB, before any step runs. To fit: {line.fix or _biggest_fix(self.resident)}")
                return "\n".join(why)  # every phase is over too: naming them says nothing more
        for phase in sorted(self.phases, key=lambda p: -p.bytes):
            total = self.resident_bytes + phase.bytes
            if total > self.gpu_bytes:
                main = phase.main_line()
                why.append(f"{phase.label} needs {gib(total)} GiB per GPU ({gib(self.resident_bytes)} resident + "
                           f"{gib(phase.bytes)}, of which '{main.label}' {gib(main.bytes)}), over the GPU's {gpu} "
                           f"GiB. To fit: {main.fix or _biggest_fix(self.resident)}")
        return "\n".join(why) or None

    def engine_shares(self) -> list[tuple[str, float, float]]:
        """(key, share now, largest share that fits) of each colocated engine: a sleeping policy
        engine may take what the resident memory leaves while it generates; an engine that never
        sleeps, what the resident memory and the largest other phase leave."""
        if self.gpu_bytes is None:
            return []
        run, out = self.run, []
        for key, share, awake in (("vllm_gpu_memory_utilization", run.vllm_share, "rollout"),
                                  ("ref_vllm_memory", run.ref_vllm_share, "anchors")):
            line = "vllm" if key.startswith("vllm") else "ref_vllm"
            sleeps = run.vllm_sleep and any(p.key == awake and p.lines[0].key == line for p in self.phases)
            if not any(x.key == line for x in self.resident) and not sleeps:
                continue
            g = self.gpu_bytes
            others = self.resident_bytes - (sleep_leftover_bytes(share, g) if sleeps else vllm_engine_bytes(share, g))
            busiest = max((p.bytes for p in self.phases if p.key != awake), default=0)
            if sleeps:  # awake: the share beside the rest; asleep: its leftovers beside the busiest phase
                fits = min((g - others) / g, (g - others - busiest) / (SLEEP_LEFTOVER_SHARE * g))
            else:
                fits = (g - others - busiest) / g
            out.append((key, share, max(0.0, math.floor(100 * min(fits, 1.0)) / 100)))
        return out

    def check(self, *, file: str | None = None) -> None:
        """ArmorLabError naming the line that overflows and what would make it fit."""
        why = self.overflow()
        if why is not None:
            raise ArmorLabError(f"memory plan: {why}", key="gpu_memory_gb", value=gib(self.gpu_bytes), file=file)


def gib(n: int | None) -> float | None:
    return None if n is None else round(n / GIB, 1)


def _biggest_fix(lines: list[Line]) -> str:
    fixes = [line for line in sorted(lines, key=lambda x: -x.bytes) if line.fix]
    return fixes[0].fix if fixes else "more GPU memory per process"


# --------------------------------------------------------------------------- assembling
FIX_FSDP = "shard the model: FSDP2 full-shard through accelerate (e.g. --profile slurm/gpu-8x-fsdp.yaml)"
FIX_BF16 = "load bf16 weights (model_init_kwargs: {dtype: bfloat16})"
FIX_OFFLOAD = "more GPUs per run, or FSDP CPU offload (fsdp_offload_params: true in the accelerate config)"
FIX_MICRO = ("a smaller micro-batch: per_device_train_batch_size (raise gradient_accumulation_steps to keep "
             "the optimiser batch)")


def _fix_micro(run: RunMemory) -> str:
    """The micro-batch fix; checkpointing is advised only where it is off."""
    return FIX_MICRO if run.gradient_checkpointing else f"{FIX_MICRO}, gradient_checkpointing: true"


def _mixed(par: Parallelism, run: RunMemory) -> bool:
    """Mixed precision is on: the accelerate config asks for it, or the run config (bf16/fp16: the
    Trainer passes it to its Accelerator)."""
    return par.mixed_precision != "no" or run.compute_dtype != "float32"


def _state_bytes(par: Parallelism, run: RunMemory) -> tuple[int, int, int]:
    """(weight, gradient, optimiser-state) bytes per parameter, where the training keeps them."""
    load = DTYPE_BYTES[run.load_dtype]
    if par.kind == "fsdp" and _mixed(par, run):
        # accelerate upcasts trainable parameters to fp32 master weights (fsdp2_prepare_model);
        # the moments follow the parameters' dtype
        return 4, 4, 8
    if par.kind.startswith("zero") and run.compute_dtype != "float32":
        # DeepSpeed (the ZeRO paper's mixed-precision Adam, §3.1): 16-bit weights and gradients,
        # K = 12 bytes of optimiser state (fp32 master copy, momentum, variance)
        return 2, 2, 12
    return load, load, 2 * load


def plan_memory(shape: ModelShape, par: Parallelism, run: RunMemory, gpu_bytes: int | None) -> MemoryPlan:
    """The plan of one run on one GPU of ``gpu_bytes`` (None: CPU or unknown, nothing is refused)."""
    plan = MemoryPlan(shape, par, run, gpu_bytes)
    n, n_proc = shape.params, max(1, par.processes)
    w, g, o = _state_bytes(par, run)
    b = DTYPE_BYTES[run.compute_dtype]
    # ZeRO stage 1 shards the optimiser state, 2 also the gradients, 3 (= FSDP full shard) also the weights
    shard_w = n_proc if par.shards_params else 1
    shard_g = n_proc if par.kind in ("fsdp", "zero2", "zero3") else 1
    shard_o = n_proc if par.kind in ("fsdp", "zero1", "zero2", "zero3") else 1
    on_gpu = 0 if par.offload else 1
    fix_state = FIX_OFFLOAD if par.shards_params else FIX_FSDP
    if not par.shards_params and run.load_dtype == "float32":
        fix_state = f"{FIX_FSDP}; {FIX_BF16}"
    upcast = " (fp32 master: accelerate upcasts under FSDP mixed precision)" if par.kind == "fsdp" and w == 4 else ""
    res = plan.resident
    res.append(Line("weights", f"policy weights ({_dt(w)}{_per(shard_w)})", on_gpu * n * w // shard_w,
                    f"{n:,} params × {w} B{upcast}", fix_state))
    res.append(Line("grads", f"gradients ({_dt(g)}{_per(shard_g)})", on_gpu * n * g // shard_g,
                    "one per parameter", fix_state))
    if par.kind == "ddp":
        res.append(Line("buckets", f"DDP gradient buckets ({_dt(g)})", ddp_bucket_bytes(n, g),
                        "gradient_as_bucket_view off", fix_state))
    moments = "fp32 master + 2 fp32 moments" if o == 12 else f"2 × {_dt(o // 2)} moments"
    res.append(Line("optim", f"AdamW state ({moments}{_per(shard_o)})", on_gpu * n * o // shard_o,
                    "exp_avg, exp_avg_sq", fix_state))
    if run.reference:
        ref_w = DTYPE_BYTES[run.load_dtype]
        res.append(Line("ref", f"π_ref weights ({_dt(ref_w)}{_per(shard_w)})", on_gpu * n * ref_w // shard_w,
                        "frozen copy, sharded like the policy" if shard_w > 1 else "a full copy on every GPU",
                        fix_state if shard_w == 1 else FIX_OFFLOAD))
    if gpu_bytes is not None and run.use_vllm and run.vllm_mode == "colocate" and not run.vllm_sleep:
        res.append(Line("vllm", f"policy vLLM engine ({run.vllm_share:g} of the GPU, never asleep)",
                        vllm_engine_bytes(run.vllm_share, gpu_bytes), "vllm_gpu_memory_utilization",
                        "vllm_enable_sleep_mode: true (the engine frees its share while training), or a smaller "
                        "vllm_gpu_memory_utilization"))
    if gpu_bytes is not None and run.anchors and run.ref_vllm_mode == "colocate" and not run.vllm_sleep:
        res.append(Line("ref_vllm", f"π_ref vLLM engine ({run.ref_vllm_share:g} of the GPU, never asleep)",
                        vllm_engine_bytes(run.ref_vllm_share, gpu_bytes), "ref_vllm_memory",
                        "a smaller ref_vllm_memory, or ref_vllm_mode: server (its own GPU)"))
    if gpu_bytes is not None:
        res.append(Line("context", "CUDA context + NCCL (assumed)", CUDA_CONTEXT_BYTES, "per process"))
        res.append(Line("frag", "allocator fragmentation (allowance)", fragmentation_bytes(gpu_bytes),
                        f"{FRAGMENTATION_SHARE:.0%} of the GPU: reserved blocks no tensor uses"))
        if run.use_vllm and run.vllm_mode == "colocate" and run.vllm_sleep:
            res.append(Line("sleep", "sleeping policy engine's leftovers (allowance)",
                            sleep_leftover_bytes(run.vllm_share, gpu_bytes),
                            f"{SLEEP_LEFTOVER_SHARE:.0%} of its share (vLLM: sleep frees up to 90 %+)"))
        if run.anchors and run.ref_vllm_mode == "colocate" and run.vllm_sleep:  # the π_ref engine sleeps alike
            res.append(Line("ref_sleep", "sleeping π_ref engine's leftovers (allowance)",
                            sleep_leftover_bytes(run.ref_vllm_share, gpu_bytes),
                            f"{SLEEP_LEFTOVER_SHARE:.0%} of its share (vLLM: sleep frees up to 90 %+)"))
    _phases(plan, w, b, _forward_bytes(par, run))
    _engines(plan)
    return plan


def _forward_bytes(par: Parallelism, run: RunMemory) -> int:
    """The dtype of a forward outside autocast (generation, validation, the probe): FSDP's
    mixed-precision policy gathers parameters in the 16-bit dtype; otherwise the weights' own."""
    if par.kind in ("fsdp", "zero3") and _mixed(par, run):
        return DTYPE_BYTES[run.compute_dtype]
    return DTYPE_BYTES[run.load_dtype]


def _per(shards: int) -> str:
    return f" /{shards}" if shards > 1 else ""


def _dt(nbytes: int) -> str:
    return {4: "fp32", 2: "bf16"}.get(nbytes, f"{nbytes} B")


def _phases(plan: MemoryPlan, w: int, b: int, fb: int) -> None:
    s, par, run = plan.shape, plan.parallel, plan.run
    fsdp = par.kind == "fsdp"
    rows, seq = run.train_rows, run.seq_tokens
    tokens = rows * seq
    head_b = 4 if run.cast_lm_head_to_fp32 else b
    scored = rows * run.completion_tokens  # TRL scores only completion tokens on Triton devices
    ref_gather, ref_units = [], []
    if run.reference and fsdp:  # π_ref sharded per layer (train/reference.shard_per_layer)
        ref_gather = [Line("ref_gather", "π_ref gathered for a generate call (FSDP2, per layer)", s.params * b,
                           "each layer gathered once per call and kept until it ends, not once per token",
                           "ref_vllm_mode: colocate or server for anchors")]
        ref_units = [Line("ref_units", "π_ref gathered units (FSDP2, per layer)", fsdp_unit_bytes(s, b, grads=False),
                          "a forward gathers one layer at a time, the next prefetched")]
    # 1. a training micro-batch: the activations its forward keeps, then the backward's peak (the
    # fused head's backward first, then one layer at a time)
    head_bw = (logprob_tile_bytes(scored, s.vocab_size, head_b, backward=True)
               + fused_head_backward_bytes(scored, s.vocab_size, s.hidden_size, head_b, b if fsdp else w))
    layer_bw = backward_peak_bytes(s, tokens, b, run.gradient_checkpointing)
    lines = [Line("act", f"activations kept ({rows} × {seq} tokens, checkpointing "
                         f"{'on' if run.gradient_checkpointing else 'off'})",
                  training_activation_bytes(s, tokens, b, run.gradient_checkpointing) + attention_mask_bytes(rows, seq),
                  "per layer: its input (checkpointing) or every saved tensor", _fix_micro(run)),
             Line("bw", "backward peak: " + ("fused log-prob head (fp32 grads)" if head_bw >= layer_bw else
                                             "one layer's recompute + gradients"), max(head_bw, layer_bw),
                  "TRL 1.16 chunked log-probs / per-layer backward", _fix_micro(run))]
    if fsdp:
        lines.append(Line("units", "FSDP2 gathered units + their grads", fsdp_unit_bytes(s, b, grads=True),
                          "2 layers + LM head in bf16", _fix_micro(run)))
    elif w != b and not par.offload:
        lines.append(Line("autocast", "autocast weight copies", s.params * b,
                          "fp32 weights cast for the forward (torch.autocast caches them)", FIX_BF16))
    plan.phases.append(Phase("train", "a training micro-batch", tuple(lines)))
    # 2. scoring: old/π_ref log-probs without gradients, per_device_train_batch_size rows at a time
    lines = [Line("score", f"no-grad forward ({rows} × {seq} tokens)", forward_no_grad_bytes(s, tokens, b)
                  + attention_mask_bytes(rows, seq) + logprob_tile_bytes(scored, s.vocab_size, head_b),
                  "one layer at a time + one log-prob tile", _fix_micro(run)), *ref_units]
    plan.phases.append(Phase("score", "log-prob scoring (old / π_ref)", tuple(lines)))
    # 3. the rollout's generation
    if run.use_vllm and run.vllm_mode == "colocate":
        if run.vllm_sleep and plan.gpu_bytes is not None:
            plan.phases.append(Phase("rollout", "rollout generation (policy engine awake)", (
                Line("vllm", f"policy vLLM engine ({run.vllm_share:g} of the GPU, less its resident leftovers)",
                     vllm_engine_bytes(run.vllm_share, plan.gpu_bytes)
                     - sleep_leftover_bytes(run.vllm_share, plan.gpu_bytes), "vllm_gpu_memory_utilization",
                     "a smaller vllm_gpu_memory_utilization (fewer sequences in flight)"),)))
    elif not run.use_vllm:
        plan.phases.append(Phase("rollout", "rollout generation (HF generate)", (
            Line("gen", f"KV cache + sampling ({run.generation_rows} rows × {seq} tokens)",
                 generate_bytes(s, run.generation_rows, run.prompt_tokens, run.completion_tokens, fb),
                 "TRL generates the process's whole generation batch in one call",
                 "use_vllm: true (vllm_mode: colocate, vllm_enable_sleep_mode: true), or fewer rows per "
                 "generation (per_device_train_batch_size × steps_per_generation)"),
            *([Line("units", "FSDP2 gathered units", fsdp_unit_bytes(s, fb, grads=False))] if fsdp else []))))
    # 4. anchors: π_ref samples k per prompt, per_device_eval_batch_size rows per generate
    if run.anchors and run.ref_vllm_mode == "none":
        plan.phases.append(Phase("anchors", "anchor sampling (π_ref, HF generate)", (
            Line("gen", f"KV cache + sampling ({run.eval_rows * run.anchor_draws} rows × {seq} tokens)",
                 generate_bytes(s, run.eval_rows * run.anchor_draws, run.prompt_tokens, run.completion_tokens, fb),
                 "per_device_eval_batch_size prompts × their draws per call",
                 "a smaller per_device_eval_batch_size, or ref_vllm_mode: colocate/server"), *ref_gather)))
    elif run.anchors and run.ref_vllm_mode == "colocate" and run.vllm_sleep and plan.gpu_bytes is not None:
        # the policy engine sleeps again before the anchors are drawn (TRL puts it to sleep after its generate)
        plan.phases.append(Phase("anchors", "anchor sampling (π_ref engine awake)", (
            Line("ref_vllm", f"π_ref vLLM engine ({run.ref_vllm_share:g} of the GPU, less its resident leftovers)",
                 vllm_engine_bytes(run.ref_vllm_share, plan.gpu_bytes)
                 - sleep_leftover_bytes(run.ref_vllm_share, plan.gpu_bytes), "ref_vllm_memory",
                 "a smaller ref_vllm_memory (fewer sequences in flight)"),)))
    # 5. validation (and the probe's samples): HF generate, or the policy engine with use_vllm
    if run.validation and not run.use_vllm:
        plan.phases.append(Phase("val", "validation (HF generate)", (
            Line("gen", f"KV cache + sampling ({run.eval_rows} rows × {seq} tokens)",
                 generate_bytes(s, run.eval_rows, run.prompt_tokens, run.completion_tokens, fb),
                 "per_device_eval_batch_size rows per call", "a smaller per_device_eval_batch_size"),
            *([Line("units", "FSDP2 gathered units", fsdp_unit_bytes(s, fb, grads=False))] if fsdp else []))))
    if run.validation and run.probe and run.reference:
        probe = Line("probe", f"exact-KL probe logits ({rows} rows × {run.completion_tokens} × {s.vocab_size})",
                     probe_chunk_bytes(s, rows, run.prompt_tokens, run.completion_tokens, fb),
                     "two models' full-vocabulary logits + float32 KL terms, per_device_train_batch_size rows",
                     "kl_probe_prompts: 0, or a smaller per_device_train_batch_size (the probe's chunk"
                     + _rows_that_fit(plan, probe_chunk_bytes(s, 1, run.prompt_tokens, run.completion_tokens, fb)
                                      + sum(x.bytes for x in ref_gather)) + ")")
        sample = Line("gen", f"probe sampling KV ({run.eval_rows} rows × {seq} tokens)",
                      generate_bytes(s, run.eval_rows, run.prompt_tokens, run.completion_tokens, fb),
                      "HF generate on the policy and π_ref", "a smaller per_device_eval_batch_size")
        plan.phases.append(Phase("probe", "exact-KL probe", (max(probe, sample, key=lambda x: x.bytes), *ref_gather)))
    # 6. a reset π_ref ← π_θ: local shards under FSDP2 (one parameter's shard cast at a time), in place otherwise
    if run.resets and run.reference:
        plan.phases.append(Phase("reset", "π_ref reset", (
            Line("reset", "one parameter's local shard, cast" if fsdp else "in-place copy",
                 s.largest_param * max(w, 4) // par.processes if fsdp else 0,
                 "each rank copies its own shards" if fsdp else "copy_ into π_ref's tensors, nothing gathered"),)))
    # 7. weight pushes into colocated engines, one full parameter at a time (full_tensor() under FSDP2):
    # the policy's before each generation, π_ref's after each reset
    if run.use_vllm and run.vllm_mode == "colocate":
        lines = [Line("param", "one full parameter (full_tensor)" if fsdp else "parameters read in place",
                      s.largest_param * w if fsdp else 0, "streamed one at a time")]
        if run.vllm_sleep:
            lines.insert(0, Line("engine_w", f"policy engine weights ({_dt(DTYPE_BYTES[_engine_dtype(s)])}, woken)",
                                 s.params * DTYPE_BYTES[_engine_dtype(s)] // run.vllm_tp,
                                 "TRL wakes the weights before the push (sleep level 2 dropped them)",
                                 "vllm_tensor_parallel_size > 1"))
        plan.phases.append(Phase("push", "policy vLLM weight push", tuple(lines)))
    if run.anchors and run.ref_vllm_mode == "colocate" and run.resets and fsdp:
        lines = [Line("param", "one full π_ref parameter (full_tensor)", s.largest_param * DTYPE_BYTES[run.load_dtype],
                      "streamed one at a time")]
        if run.vllm_sleep:
            lines.insert(0, Line("engine_w", f"π_ref engine weights ({_dt(DTYPE_BYTES[run.ref_vllm_dtype])}, woken)",
                                 s.params * DTYPE_BYTES[run.ref_vllm_dtype] // run.ref_vllm_tp,
                                 "the push wakes the engine's weights only", "ref_vllm_tensor_parallel_size > 1"))
        plan.phases.append(Phase("ref_push", "π_ref vLLM weight push", tuple(lines)))
    if run.optimizer in ("adamw_torch", "adamw_hf"):  # foreach AdamW: sqrt(v) of every parameter at once
        shard = par.processes if par.kind in ("fsdp", "zero1", "zero2", "zero3") else 1
        plan.phases.append(Phase("optim", "optimizer step (foreach AdamW)", (
            Line("optim_tmp", "AdamW temporaries", s.params * _state_bytes(par, run)[2] // 2 // shard,
                 "one state-sized temporary", "optim: adamw_torch_fused"),)))


def _rows_that_fit(plan: MemoryPlan, one_row: int) -> str:
    """', at most N rows fit' for a phase whose bytes grow about linearly in its rows."""
    if plan.gpu_bytes is None:
        return ""
    rows = (plan.gpu_bytes - plan.resident_bytes) // max(one_row, 1)
    return f": at most {rows} rows fit" if rows > 0 else ": not even one row fits"


def _engine_dtype(s: ModelShape) -> str:
    """vLLM's dtype 'auto' (TRL passes no dtype): the checkpoint's 16-bit dtype, bf16 for fp32 ones."""
    return s.dtype if s.dtype in ("bfloat16", "float16") else "bfloat16"


def _engines(plan: MemoryPlan) -> None:
    """Each colocated engine must hold its weights, its profile's activations and one sequence of
    the maximum length inside its share, or vLLM refuses to start."""
    if plan.gpu_bytes is None:
        return
    s, run = plan.shape, plan.run
    max_len = run.vllm_max_len or s.max_positions
    if run.use_vllm and run.vllm_mode == "colocate":
        eb = DTYPE_BYTES[_engine_dtype(s)]
        needs = (s.params * eb // run.vllm_tp + vllm_overhead_bytes(s, run.vllm_max_seqs, eb)
                 + kv_cache_bytes(s, max_len, eb) // run.vllm_tp)
        plan.engines.append((f"the policy vLLM engine ({_dt(eb)}, TP {run.vllm_tp})", needs,
                             vllm_engine_bytes(run.vllm_share, plan.gpu_bytes),
                             "a larger vllm_gpu_memory_utilization, vllm_tensor_parallel_size > 1, or a smaller "
                             "vllm_max_model_length"))
    if run.anchors and run.ref_vllm_mode == "colocate":
        eb = DTYPE_BYTES[run.ref_vllm_dtype]
        needs = (s.params * eb // run.ref_vllm_tp + vllm_overhead_bytes(s, VLLM_DEFAULT_MAX_SEQS, eb)
                 + kv_cache_bytes(s, max_len, eb) // run.ref_vllm_tp)
        plan.engines.append((f"the π_ref vLLM engine ({_dt(eb)}, TP {run.ref_vllm_tp})", needs,
                             vllm_engine_bytes(run.ref_vllm_share, plan.gpu_bytes),
                             "a larger ref_vllm_memory" + (", ref_vllm_dtype: bfloat16" if eb == 4 else "")
                             + ", or ref_vllm_tensor_parallel_size > 1"))

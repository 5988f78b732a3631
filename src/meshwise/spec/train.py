"""How it is trained: TrainSpec (one optimizer step), the precisions and optimizers, and the default
sequence a plan or a trace takes when none is given.

Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from meshwise.errors import MeshwiseError
from meshwise.spec.gpu_keys import MODEL_CODES, RUNTIMES, SELECTIVE_POLICIES
from meshwise.spec.model import ModelSpec, cached_hash

MOE_BALANCING = ("aux-loss", "aux-loss-free", "forced", "random")  # the keys of catalog/moe_imbalance.toml
# how a rank's experts' GEMMs run: the runtime's own ("te": Megatron's Transformer Engine GroupedLinear, one
# cuBLAS GEMM per local expert on 4 streams, its --moe-grouped-gemm default; meshwise's runtime/moe.py loop),
# one grouped kernel for all (DeepGEMM's, torch._grouped_mm), or one cuBLAS GEMM per local expert in sequence
# from C++ ("cublas-loop": the grouped_gemm package's default build, grouped_gemm.ops.gmm), or one grouped
# kernel over every expert's tokens padded to the busiest expert's count ("grouped-padded": KempnerForge's)
EXPERT_GEMMS = ("te", "grouped", "cublas-loop", "grouped-padded")
# who carries the tokens to the experts: all-to-alls of every token copy (meshwise's runtime, Megatron's
# alltoall dispatcher) or DeepEP's dispatch and combine (a token sent once to each rank, or across the
# scale-out network once to each node, that holds any of its experts; the permutation fused into one kernel)
MOE_DISPATCHERS = ("all-to-all", "deepep")
PRECISIONS = ("bf16", "bf16-mixed", "fp32", "fp8", "fp8-rowwise", "fp8-blockwise", "mxfp8")
# The float8 formats: the linear layers' GEMMs in float8 (e4m3), everything else as bf16-mixed
# (embedding, head, router, softmax/attention, norms in bf16; fp32 master weights): cost/fp8.py.
FP8_FORMATS = ("fp8", "fp8-rowwise", "fp8-blockwise", "mxfp8")
OPTIMIZERS = ("adamw", "sgd")
DEFAULT_SEQ_CAP = 4096  # tokens: the default sequence is the model's max_seq, capped here
DEFAULT_SEQ_STATES_ONLY = 2048  # tokens: the default for a model given only by its parameter count


def default_seq_len(model: ModelSpec) -> int:
    """The sequence a plan or a trace takes when none is given."""
    return DEFAULT_SEQ_STATES_ONLY if model.states_only else min(model.max_seq, DEFAULT_SEQ_CAP)


@dataclass(frozen=True)
class TrainSpec:
    """One optimizer step: ``global_batch`` sequences of ``seq_len`` tokens."""

    global_batch: int
    seq_len: int
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    overlap_dp_comm: bool = True  # DP reductions overlap the backward (torch DDP/FSDP); Megatron-LM 2021 did not
    runtime: str = (
        "meshwise"  # whose kernels and overlap are predicted: meshwise (torch) or megatron (Megatron-LM/NeMo)
    )
    overlap_tp_comm: bool = False  # TP collectives hidden behind GEMMs (Transformer Engine's userbuffers): off
    # by default in both runtimes (Megatron-LM's --tp-comm-overlap is store_true, megatron/training/arguments.py;
    # NeMo's recipes turn it on, and published runs that used it say so)
    fused_attention: bool = True  # flash/cuDNN attention; False for the unfused softmax of Megatron-LM 2021
    selective_policy: str = "meshwise"  # what ac=selective recomputes: meshwise's op policy, or torchtitan's
    # "every-other-matmul" (its op SAC also recomputes every second mm)
    model_code: str = "meshwise"  # whose model code's memory-bound operators run under the meshwise runtime
    # (their bytes: cost/kernels.py PASSES): meshwise's, or torchtitan's Llama
    overlap_ep_comm: bool = False  # the dispatch/combine all-to-alls hidden behind another micro-batch's compute
    # (Megatron's --overlap-moe-expert-parallel-comm, off by default; DualPipe)
    moe_capacity_factor: float = 0.0  # Megatron's moe_expert_capacity_factor with the experts' inputs padded to
    # it (moe_pad_expert_input_to_capacity); 0: dropless, Megatron's default
    moe_balancing: str = "aux-loss"  # how dropless routing is balanced: "aux-loss" or "aux-loss-free" (per-expert
    # bias, DeepSeek-V3); the busiest rank's load: catalog/moe_imbalance.toml
    expert_gemm: str = "te"  # the experts' GEMMs (EXPERT_GEMMS): the runtime's own, "grouped", ...
    moe_dispatcher: str = "all-to-all"  # who carries the tokens to the experts (MOE_DISPATCHERS)
    mtp_layers: int = 0  # multi-token-prediction modules trained beside the model (Megatron's --mtp-num-layers;
    # DeepSeek-V3 trains one): each one more block, a 2h x h projection and the head again, on the last stage
    loss_fusion: bool = False  # Megatron's --cross-entropy-loss-fusion (off by default in Megatron-LM; NeMo 2.0's
    # GPTConfig turns it on): the loss's bytes per logit, cost/kernels.py PASSES
    grad_reduce_bytes: int = 0  # bytes per gradient element the DP reductions carry: 0 the runtime's (float32 but
    # under pure bf16: Megatron-LM and NeMo 2.0 reduce in float32); 2 where a run states bf16 (NeMo 1.x's
    # distributed_fused_adam ``grad_sync_dtype: bf16``)

    __hash__ = cached_hash

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise MeshwiseError(f"--global-batch: {self.global_batch} must be at least 1")
        if self.seq_len < 1:
            raise MeshwiseError(f"--seq-len: {self.seq_len} must be at least 1")
        for flag, value, valid in (
            ("--precision", self.precision, PRECISIONS),
            ("--optimizer", self.optimizer, OPTIMIZERS),
            ("--runtime", self.runtime, RUNTIMES),
            ("selective_policy", self.selective_policy, SELECTIVE_POLICIES),
            ("model_code", self.model_code, MODEL_CODES),
            ("--moe-balancing", self.moe_balancing, MOE_BALANCING),
            ("expert_gemm", self.expert_gemm, EXPERT_GEMMS),
            ("moe_dispatcher", self.moe_dispatcher, MOE_DISPATCHERS),
        ):
            if value not in valid:
                raise MeshwiseError(f"{flag}: {value!r} is not one of {', '.join(valid)}")
        if self.grad_reduce_bytes not in (0, 2, 4):
            raise MeshwiseError(
                f"grad_reduce_bytes: {self.grad_reduce_bytes!r} is not one of 0 (the runtime's), 2 (bf16), 4 (float32)"
            )
        if self.overlap_tp_comm and self.runtime != "megatron":
            raise MeshwiseError(
                "--tp-comm-overlap: Transformer Engine's TP communication overlap is a Megatron-LM "
                "setting; add --runtime megatron"
            )
        if self.overlap_ep_comm and self.runtime != "megatron":
            raise MeshwiseError(
                "--moe-comm-overlap: the all-to-all overlap is a Megatron-LM setting "
                "(--overlap-moe-expert-parallel-comm); add --runtime megatron"
            )
        if self.moe_capacity_factor < 0:
            raise MeshwiseError(f"--moe-capacity-factor: {self.moe_capacity_factor} must be 0 (dropless) or positive")
        if self.mtp_layers < 0 or (self.mtp_layers and self.runtime != "megatron"):
            raise MeshwiseError(
                f"--mtp-layers: {self.mtp_layers} must be 0, or at least 1 under --runtime megatron "
                "(meshwise's runtime trains no multi-token-prediction module)"
            )
        if self.loss_fusion and self.runtime != "megatron":
            raise MeshwiseError("loss_fusion: Megatron's fused cross-entropy is a --runtime megatron setting")
        if self.model_code != "meshwise" and self.runtime != "meshwise":
            raise MeshwiseError(
                f"model_code: {self.model_code!r} runs under the meshwise runtime, not {self.runtime!r}"
            )

    @cached_property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @cached_property
    def fp8(self) -> bool:
        """Whether the linear layers' GEMMs run in a float8 format (FP8_FORMATS)."""
        return self.precision in FP8_FORMATS

    @cached_property
    def mixed(self) -> bool:
        """bf16 compute over fp32 master weights: bf16-mixed, and every float8 format (which keeps
        bf16 weights beside the fp32 master and casts them to float8 at each GEMM)."""
        return self.precision == "bf16-mixed" or self.fp8

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes per parameter of the weights the forward uses: 4 for fp32, 2 otherwise."""
        return 4 if self.precision == "fp32" else 2

    @cached_property
    def grad_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @cached_property
    def optimizer_bytes(self) -> int:
        """Optimizer bytes per parameter (docs/design.md): Adam moments 8, SGD momentum 4; bf16-mixed and
        the float8 formats add a 4-byte fp32 master; fp8-blockwise keeps DeepSeek-V3's bf16 moments
        (arXiv 2412.19437 Sec. 3.3: AdamW's two moments in bf16, master weights in fp32)."""
        moments = 8 if self.optimizer == "adamw" else 4
        if self.precision == "fp8-blockwise":
            moments //= 2
        master = 4 if self.mixed else 0
        return moments + master

    @cached_property
    def state_bytes_per_param(self) -> int:
        """12 for bf16, 16 for bf16-mixed, fp32 and fp8/fp8-rowwise/mxfp8, 12 for fp8-blockwise (with AdamW)."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    @cached_property
    def activation_bytes(self) -> int:
        """Bytes per activation element: 2 in bf16, 4 in fp32."""
        return 4 if self.precision == "fp32" else 2

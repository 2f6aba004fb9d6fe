"""The training smoke run: a few transformer layers trained with DDP on synthetic data.

Run one process per rank, by torchrun on a cluster or by the local launcher::

    torchrun --nproc-per-node 8 -m steps.readiness.ranks.smoke --backend nccl --steps 30 --out smoke.json

The task is learnable (each token's label is a fixed function of the token), so a healthy run's
loss falls. Each rank records its loss, its step time and its own time (the forward pass and any
injected delay: work that is not waiting for the others) at every step. Rank 0 gathers them: the loss
must fall, no rank may see NaN or Inf, a rank whose own time exceeds the median rank's by more than
the straggler skew (as a fraction of the median step) is a straggler; throughput, and on GPU the
achieved TFLOP/s per GPU against the accelerator's peak, are reported.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from steps.errors import DsxError
from steps.files import write_text
from steps.readiness.models import Model, dump_json
from steps.readiness.ranks.inject import Injection, fail_or_hang, parse_injections
from steps.readiness.ranks.rankenv import RankEnv, exit_rank, joined, stacks_on_signals, sync

__all__ = ["RankTraining", "SmokeConfig", "SmokeResult", "main", "run_rank", "smoke_args"]

_WARM_STEPS = 2
_LOSS_WINDOW = 3


class SmokeConfig(BaseModel):
    """The model and run; the same on every rank. Defaults are tiny (CPU); GPUs want larger ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = "gloo"
    steps: int = Field(default=20, ge=_WARM_STEPS + 2 * _LOSS_WINDOW)
    batch_size: int = Field(default=8, ge=1)
    seq_len: int = Field(default=32, ge=2)
    d_model: int = Field(default=64, ge=8)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    vocab: int = Field(default=64, ge=4)
    lr: float = Field(default=3e-3, gt=0)
    seed: int = 0
    peak_tflops: float | None = Field(default=None, gt=0, description="dense bf16 peak per GPU")
    inject: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=300.0, gt=0)


class RankTraining(Model):
    """One rank's record of the run."""

    rank: int
    host: str
    step_s: list[float]
    own_s: list[float] = Field(description="forward pass and injected delay: time not spent waiting")
    losses: list[float | None] = Field(description="None where the loss was NaN or Inf")
    first_nonfinite_step: int | None = None
    median_step_s: float
    median_own_s: float
    skew: float = Field(description="(own time - median rank's own time) / median step time")
    injected: str | None = None


class SmokeResult(Model):
    """What rank 0 reports for the whole run."""

    backend: str
    device: str
    world_size: int
    steps: int
    parameters: int
    tokens_per_step: int
    config: dict[str, Any]
    losses: list[float | None] = Field(description="mean loss over ranks per step; None if not finite")
    initial_loss: float | None
    final_loss: float | None
    ranks: list[RankTraining]
    median_step_s: float
    throughput_tokens_s: float
    tflops_per_gpu: float | None = Field(description="achieved, per rank (GPU runs only)")
    mfu: float | None = Field(description="achieved TFLOP/s over the peak (GPU runs with a peak)")
    injected: list[str] = Field(default_factory=list)


def smoke_args(config: SmokeConfig) -> list[str]:
    """The command-line flags that make :func:`main` run ``config``."""
    args: list[str] = []
    for name, value in config.model_dump().items():
        if name == "inject":
            for spec in value:
                args += ["--inject", spec]
        elif value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def _build(torch: Any, config: SmokeConfig) -> Any:
    nn = torch.nn

    class TinyLM(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(config.vocab, config.d_model)
            self.positions = nn.Embedding(config.seq_len, config.d_model)
            layer = nn.TransformerEncoderLayer(
                config.d_model,
                config.heads,
                dim_feedforward=4 * config.d_model,
                dropout=0.0,
                batch_first=True,
                norm_first=True,
            )
            self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
            self.head = nn.Linear(config.d_model, config.vocab)

        def forward(self, x: Any) -> Any:
            positions = torch.arange(x.shape[1], device=x.device)
            return self.head(self.encoder(self.tokens(x) + self.positions(positions)))

    return TinyLM()


def _flops_per_token(model: Any, config: SmokeConfig) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters + 12 x layers x d_model x seq_len."""
    embedding = model.tokens.weight.numel() + model.positions.weight.numel()
    dense = sum(p.numel() for p in model.parameters()) - embedding
    return float(6.0 * dense + 12.0 * config.layers * config.d_model * config.seq_len)


def run_rank(config: SmokeConfig, env: RankEnv) -> SmokeResult | None:
    """Train as one rank; rank 0 returns the result, the others ``None``.

    Raises:
        InjectedFailure: this rank was told to fail (``RANK:fail``).
    """
    injections = {i.rank: i for i in parse_injections(config.inject, env.world_size)}
    with joined(config.backend, env, config.timeout_s) as (torch, dist, device):
        return _train(torch, dist, config, env, device, injections)


def _train(
    torch: Any, dist: Any, config: SmokeConfig, env: RankEnv, device: Any, injections: dict[int, Injection]
) -> SmokeResult | None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(config.seed)
    model = _build(torch, config).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=config.lr)
    mapping = torch.randperm(config.vocab, generator=torch.Generator().manual_seed(config.seed)).to(device)
    generator = torch.Generator().manual_seed(config.seed * 7919 + env.rank + 1)
    mine = injections.get(env.rank)
    delay = mine.seconds if mine is not None and mine.kind == "delay" else 0.0
    fault_step = config.steps // 2
    use_bf16 = device.type == "cuda"
    step_s: list[float] = []
    own_s: list[float] = []
    losses: list[float | None] = []
    first_bad: int | None = None
    for step in range(config.steps):
        if step == fault_step:
            fail_or_hang(mine, env.rank, f"at step {step}")
        tokens = torch.randint(0, config.vocab, (config.batch_size, config.seq_len), generator=generator)
        tokens = tokens.to(device)
        labels = mapping[tokens]
        sync(torch, device)
        start = time.perf_counter()
        if delay:
            time.sleep(delay)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = ddp(tokens)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, config.vocab), labels.view(-1))
        if mine is not None and mine.kind == "nan" and step >= fault_step:
            loss = loss * float("nan")
        sync(torch, device)
        own = time.perf_counter() - start
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(torch, device)
        step_s.append(time.perf_counter() - start)
        own_s.append(own)
        value = float(loss.detach().item())
        finite = math.isfinite(value)
        losses.append(value if finite else None)
        if not finite and first_bad is None:
            first_bad = step
    if first_bad is None and not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        first_bad = config.steps - 1
    record = (env.rank, env.host, step_s, own_s, losses, first_bad)
    everyone: list[Any] = [None] * env.world_size
    dist.all_gather_object(everyone, record)
    if env.rank != 0:
        return None
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return _result(config, env, model, device_name, everyone, injections)


def _result(
    config: SmokeConfig,
    env: RankEnv,
    model: Any,
    device_name: str,
    everyone: list[Any],
    injections: dict[int, Injection],
) -> SmokeResult:
    labels = {rank: injection.label() for rank, injection in injections.items()}
    timed = slice(_WARM_STEPS, None)
    medians_step = [statistics.median(record[2][timed]) for record in everyone]
    medians_own = [statistics.median(record[3][timed]) for record in everyone]
    step_median = statistics.median(medians_step)
    own_median = statistics.median(medians_own)
    ranks = [
        RankTraining(
            rank=rank,
            host=host,
            step_s=[round(v, 6) for v in step_s],
            own_s=[round(v, 6) for v in own_s],
            losses=[None if v is None else round(v, 6) for v in losses],
            first_nonfinite_step=first_bad,
            median_step_s=round(medians_step[index], 6),
            median_own_s=round(medians_own[index], 6),
            skew=round((medians_own[index] - own_median) / step_median, 4) if step_median > 0 else 0.0,
            injected=labels.get(rank),
        )
        for index, (rank, host, step_s, own_s, losses, first_bad) in enumerate(sorted(everyone))
    ]
    mean_losses: list[float | None] = []
    for step in range(config.steps):
        values = [record[4][step] for record in everyone]
        mean_losses.append(None if None in values else round(statistics.fmean(values), 6))
    head = [v for v in mean_losses[:_LOSS_WINDOW] if v is not None]
    tail = [v for v in mean_losses[-_LOSS_WINDOW:] if v is not None]
    tokens_per_step = config.batch_size * config.seq_len * env.world_size
    parameters = sum(p.numel() for p in model.parameters())
    tflops: float | None = None
    mfu: float | None = None
    if config.backend == "nccl" and step_median > 0:
        per_rank_tokens = config.batch_size * config.seq_len
        tflops = round(_flops_per_token(model, config) * per_rank_tokens / step_median / 1e12, 3)
        if config.peak_tflops:
            mfu = round(tflops / config.peak_tflops, 4)
    return SmokeResult(
        backend=config.backend,
        device=device_name,
        world_size=env.world_size,
        steps=config.steps,
        parameters=parameters,
        tokens_per_step=tokens_per_step,
        config={k: v for k, v in config.model_dump().items() if k not in ("inject", "timeout_s")},
        losses=mean_losses,
        initial_loss=round(statistics.fmean(head), 6) if head else None,
        final_loss=round(statistics.fmean(tail), 6) if tail else None,
        ranks=ranks,
        median_step_s=round(step_median, 6),
        throughput_tokens_s=round(tokens_per_step / step_median, 1) if step_median > 0 else 0.0,
        tflops_per_gpu=tflops,
        mfu=mfu,
        injected=[labels[rank] for rank in sorted(labels)],
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m steps.readiness.ranks.smoke", description=__doc__.splitlines()[0]
    )
    defaults = SmokeConfig()
    for name, field in SmokeConfig.model_fields.items():
        if name == "inject":
            parser.add_argument("--inject", action="append", default=[], help="RANK:KIND[=VALUE]")
            continue
        value = getattr(defaults, name)
        kind = type(value) if value is not None else float
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value, help=field.description)
    parser.add_argument("--out", type=Path, help="where rank 0 writes the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one rank of the smoke run; rank 0 writes ``--out``. Returns the exit status."""
    args = vars(_parser().parse_args(argv))
    out = args.pop("out")
    stacks_on_signals()
    try:
        config = SmokeConfig(**args)
        result = run_rank(config, RankEnv.from_environ())
    except DsxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if result is not None:
        text = dump_json(result)
        if out is not None:
            write_text(out, text)
        else:
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    exit_rank(main())

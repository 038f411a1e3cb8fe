"""`pdserve predictor record | train | eval`: the ARES hidden-state length predictor's pipeline.

- `record`: run the shipped prompt set (`prompts.py`) on the in-process engine serving a
  model, capture (hidden state, remaining length) every k tokens, write an npz file;
- `train`: fit the MLP (`hidden_state.py`) on a recorded file, split by request 70/15/15,
  report train/validation/test MAE, save the predictor;
- `eval`: the saved predictor's MAE on the held-out test requests, its inference time per
  batch of 10 (the paper's Table 1 figure), and the `history` predictor's MAE on the same
  requests for comparison.

`pdserve.cli` needs one call, `add_predictor_parser`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pdserve.config_flags import at_least


def _needs_engine(err: ImportError) -> ValueError:
    return ValueError(f"the predictor needs the engine extra (pip install 'pdserve[engine]'): "
                      f"{err}")


def _record(args: argparse.Namespace) -> int:
    try:
        import torch

        from pdserve.engine.checkpoint import resolve_model
        from pdserve.engine.engine import Engine
        from pdserve.engine.loader import load_model
        from pdserve.predictor.prompts import prompt_set
        from pdserve.predictor.record import RecordSettings, pool_blocks_for, record
    except ImportError as err:
        raise _needs_engine(err) from err

    settings = RecordSettings(every_tokens=args.every_tokens, max_tokens=args.max_tokens,
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                              batch_size=args.batch_size)
    torch.set_num_threads(args.threads)
    source = resolve_model(args.model)
    tokenizer = source.require_tokenizer()
    prompts = prompt_set(args.prompts, seed=args.seed)
    encoded = [(prompt, tokenizer.encode(source.chat_template.render(
        [{"role": "user", "content": prompt.text}]))) for prompt in prompts]
    model, _ = load_model(args.model)
    engine = Engine(model, tokenizer, pool_blocks_for(encoded, settings),
                    hidden_state_every_tokens=settings.every_tokens)
    started = time.monotonic()

    def progress(done: int, total: int, samples: int) -> None:
        if done % args.progress_every == 0 or done == total:
            print(f"[{time.monotonic() - started:7.1f} s] {done}/{total} requests, "
                  f"{samples} samples", flush=True)

    recorded = record(engine, encoded, settings, progress)
    recorded.meta["model"] = source.name
    recorded.meta["elapsed_s"] = round(time.monotonic() - started, 1)
    recorded.save(args.out)
    outputs = recorded.requests["output_tokens"]
    print(f"wrote {args.out}: {len(recorded)} samples from {len(outputs)} requests "
          f"(output tokens mean {outputs.mean():.0f}, max {outputs.max()}, "
          f"{int(recorded.requests['finish_length'].sum())} capped at {args.max_tokens}) "
          f"in {recorded.meta['elapsed_s']} s")
    return 0


def _train(args: argparse.Namespace) -> int:
    try:
        import torch

        from pdserve.predictor.hidden_state import TrainSettings, train_from_file
    except ImportError as err:
        raise _needs_engine(err) from err

    settings = TrainSettings(epochs=args.epochs, patience=args.patience, lr=args.lr,
                             weight_decay=args.weight_decay, batch_size=args.batch_size,
                             seed=args.seed)
    torch.set_num_threads(args.threads)
    report = train_from_file(args.data, args.out, settings, log=print, search=args.search)
    print(report.summary())
    return 0


def _eval(args: argparse.Namespace) -> int:
    try:
        import torch

        from pdserve.predictor.evaluate import evaluate
    except ImportError as err:
        raise _needs_engine(err) from err

    torch.set_num_threads(args.threads)
    print(evaluate(args.data, args.predictor, seed=args.seed, quantile=args.quantile).summary())
    return 0


def add_predictor_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predictor", help="record, train and evaluate ARES's hidden-state length predictor",
        description="ARES (section 4): an MLP on the model's last-layer hidden state predicts "
        "each decode's remaining output length, refreshed every k tokens.")
    sub = p.add_subparsers(dest="predictor_command", required=True)
    r = sub.add_parser("record", help="record (hidden state, remaining length) samples from "
                       "the engine serving a model on the shipped prompt set")
    r.add_argument("--model", default="", help="model (\"\": SmolLM2-135M-Instruct) [\"\"]")
    r.add_argument("--prompts", type=int, default=None,
                   help="how many prompts of the shipped set (480) [all]")
    r.add_argument("--max-tokens", type=int, default=384, help="output cap per request [384]")
    r.add_argument("--every-tokens", type=int, default=20,
                   help="k: capture every k generated tokens [20]")
    r.add_argument("--temperature", type=float, default=0.7, help="0: greedy [0.7]")
    r.add_argument("--top-p", type=float, default=0.95, help="[0.95]")
    r.add_argument("--batch-size", type=int, default=16, help="sequences at once [16]")
    r.add_argument("--threads", type=at_least(1), default=1, help="torch CPU threads [1]")
    r.add_argument("--seed", type=int, default=0, help="prompt order and sampling seed [0]")
    r.add_argument("--progress-every", type=at_least(1), default=10,
                   help="print progress every N finished requests [10]")
    r.add_argument("--out", type=Path, required=True, help="the npz file to write")
    r.set_defaults(handler=_record)
    t = sub.add_parser("train", help="train the MLP on a recorded file (split by request "
                       "70/15/15) and save it")
    t.add_argument("--data", type=Path, nargs="+", required=True,
                   help="npz file(s) from `record` (one model, cap and k)")
    t.add_argument("--out", type=Path, required=True, help="the predictor file (.pt)")
    t.add_argument("--epochs", type=int, default=100, help="at most [100]")
    t.add_argument("--patience", type=int, default=10,
                   help="early stopping: epochs without a better validation MAE [10]")
    t.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate [1e-3]")
    t.add_argument("--weight-decay", type=float, default=1e-2, help="AdamW [1e-2]")
    t.add_argument("--batch-size", type=int, default=64, help="[64]")
    t.add_argument("--seed", type=int, default=0, help="split and initialisation seed [0]")
    t.add_argument("--threads", type=at_least(1), default=1, help="torch CPU threads [1]")
    t.add_argument("--search", action="store_true", help="grid over learning rate "
                   "(1e-4, 3e-4, 1e-3) and batch size (16, 64, 128), keep the best "
                   "validation MAE (--lr and --batch-size are then ignored)")
    t.set_defaults(handler=_train)
    e = sub.add_parser("eval", help="test MAE, inference time per batch of 10, and the "
                       "history predictor's MAE on the same held-out requests")
    e.add_argument("--data", type=Path, nargs="+", required=True,
                   help="the npz file(s) the predictor was trained on")
    e.add_argument("--predictor", type=Path, required=True, help="file from `train`")
    e.add_argument("--seed", type=int, default=None,
                   help="split seed [the one the predictor was trained with]")
    e.add_argument("--quantile", type=float, default=0.5,
                   help="history baseline's quantile of output length [0.5]")
    e.add_argument("--threads", type=at_least(1), default=1,
                   help="torch CPU threads while timing the MLP [1]")
    e.set_defaults(handler=_eval)


if __name__ == "__main__":  # `python -m pdserve.predictor.cli record ...`
    parser = argparse.ArgumentParser(prog="pdserve")
    add_predictor_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(sys.argv[1:])
    sys.exit(int(parsed.handler(parsed)))

"""`pdserve serve`: its options, their config (`serve_config`) and the start of the server
(`launch.py` builds it)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from pdserve.config import Config, read_yaml, serve_defaults
from pdserve.config_flags import POLICY_FLAGS, SERVE_FLAGS, SLO_FLAGS, add_flags, flag_values

API_KEY_ENV = "PDSERVE_API_KEY"


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Start worker processes (one torch thread each) and an OpenAI-compatible "
        "server whose global scheduler runs the same policies as the simulator. Each option "
        "sets one value of the config tree (pdserve.config; serve's own defaults: "
        "SERVE_DEFAULTS); --config FILE sets any of them, and the options override it.")
    defaults = serve_defaults()
    add_flags(p, SERVE_FLAGS, defaults)
    add_flags(p.add_argument_group("policy"), POLICY_FLAGS, defaults)
    add_flags(p.add_argument_group("SLOs (for SLO-aware policies)"), SLO_FLAGS, defaults)
    p.add_argument("--config", type=Path, help="YAML file of the config tree (nested "
                   "sections); options override it")
    p.set_defaults(handler=_run_serve)


def serve_config(args: argparse.Namespace) -> Config:
    """The config `pdserve serve` runs: the tree's defaults with `SERVE_DEFAULTS`, the API key
    in $PDSERVE_API_KEY, `--config FILE`, then the options. Unless given, --prefill is half
    of --instances and --decode the rest."""
    config = serve_defaults()
    if os.environ.get(API_KEY_ENV):
        config = config.with_values({"server.api_key": os.environ[API_KEY_ENV]})
    from_file = read_yaml(args.config) if args.config else {}
    config = config.with_values(from_file, str(args.config or ""))
    flags = flag_values(args)
    if "server.ray.address" not in flags and config.server.ray is None:
        # the --ray-* options tune Ray's workers; only --ray (or the file) starts them there
        flags = {path: value for path, value in flags.items()
                 if not path.startswith("server.ray.")}
    config = config.with_values(flags)
    given = set(from_file) | set(flags)
    instances = config.cluster.instances
    if isinstance(instances, int) and not {"cluster.prefill", "cluster.decode"} <= given:
        prefill = (config.cluster.prefill if "cluster.prefill" in given
                   else max(1, instances // 2))
        decode = config.cluster.decode if "cluster.decode" in given else max(1, instances
                                                                              - prefill)
        config = config.with_values({"cluster.prefill": prefill, "cluster.decode": decode})
    return config


def _run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from pdserve.server.connections import HeaderDeadlineProtocol
        from pdserve.server.launch import build_app
    except ImportError as err:
        raise ValueError(f"serving needs the serve extra (pip install 'pdserve[serve]'): "
                         f"{err}") from err
    config = serve_config(args)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pdserve").setLevel(config.server.log_level.upper())
    # on shutdown, open streams get 10 s to finish; the rest are cancelled (KV freed); a
    # request's headers must arrive within 20 s (`connections.py`)
    uvicorn.run(build_app(config), host=config.server.host, port=config.server.port,
                log_level=config.server.log_level, timeout_graceful_shutdown=10,
                http=HeaderDeadlineProtocol)
    return 0

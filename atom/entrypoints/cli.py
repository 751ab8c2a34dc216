"""The ``atom`` command: ``atom serve [MODEL_DIR] ...`` and ``atom bench serve ...``.

Each subcommand's flags live with the code that runs it (``args.py`` for the server,
``serve_bench.py`` for the load generator); this file only routes. Exit status: 0 on success,
2 on bad flags (argparse's convention, with the reason on stderr), 1 on a failure while running.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from atom.entrypoints.args import add_serve_arguments
    from atom.entrypoints.serve_bench import add_bench_arguments
    from atom.envs import documentation

    parser = argparse.ArgumentParser(prog="atom", description="atom: serve DeepSeek-V4 from one elastic KV arena.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="run the OpenAI-compatible server",
                           description="Serve a model over an OpenAI-compatible HTTP API. "
                                       "With no MODEL_DIR it serves the built-in tiny DeepSeek-V4 model.",
                           epilog="Environment variables (read once at start-up):\n" + documentation(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(serve)
    serve.set_defaults(command_parser=serve)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    bench_serve = bench_sub.add_parser("serve", help="load-test a running atom server (loopback only)",
                                       description="Send a bounded synthetic load to a running server and report "
                                                   "throughput, TTFT / TPOT percentiles and the cached-token ratio.")
    add_bench_arguments(bench_serve)
    bench_serve.set_defaults(command_parser=bench_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "serve":
        from atom.entrypoints.launch import serve_from_args

        return serve_from_args(args.command_parser, args)
    from atom.entrypoints.serve_bench import bench_from_args

    return bench_from_args(args.command_parser, args)


if __name__ == "__main__":
    raise SystemExit(main())

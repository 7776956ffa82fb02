"""The `simbridge-unity` console script: the connector, or one line naming the `unity` extra
when mlagents-envs is not installed (connector.py imports it at once)."""
import sys

from simbridge.extras import run_needing_extra


def _connector(argv) -> int:
    from simbridge.sims.unity.connector import main
    return main(argv)


def main(argv=None) -> int:
    return run_needing_extra("simbridge-unity", "unity", _connector, argv)


if __name__ == "__main__":
    sys.exit(main())

"""A script without a distribution strategy: it trains (prints an epoch a second) and never
opens its port, as a one-machine script run by HyperTF does (issue 54, defect 5)."""

from __future__ import annotations

import argparse
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--epoch_s", type=float, default=1.0)
    args, _ = parser.parse_known_args()
    for epoch in range(1, args.epochs + 1):
        time.sleep(args.epoch_s)
        print(f"epoch {epoch}/{args.epochs} loss={1.0 / epoch:.3f}", flush=True)
    print("trained alone", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m sjd_pac_app` is the same as the `sjd-pac-app` command."""

from .main import main

if __name__ == "__main__":
    raise SystemExit(main())

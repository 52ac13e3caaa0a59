"""Where the Mind is and who we are to it: flags, then `MINDHAND_*`, then the local Mind's files."""

from __future__ import annotations

import argparse
import os

from mind.cli.output import die


def connection_params(args: argparse.Namespace) -> tuple[str, str, str | None, str | None]:
    """URL, credential file, CA file and pin: flags, then env vars, then the local Mind's files."""
    from mind import home as paths

    home = paths.home(args.home)
    local = False
    url = args.mind or os.environ.get("MINDHAND_URL")
    if not url:
        try:
            url = paths.url_file(home).read_text().strip()
            local = True
        except OSError:
            die(
                f"no Mind URL: pass --mind URL, set MINDHAND_URL, or start `mind serve` (looked in {paths.url_file(home)})",
                kind="config",
            )
    cred = args.credential or os.environ.get("MINDHAND_CREDENTIAL") or str(paths.admin_cred_file(home))
    ca = args.ca or os.environ.get("MINDHAND_CA")
    pin = args.pin or os.environ.get("MINDHAND_PIN")
    if local and not ca and not pin and url.startswith("wss://"):
        try:
            pin = paths.pin_file(home).read_text().strip()
        except OSError:
            pass
    return url, cred, ca, pin

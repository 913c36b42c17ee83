"""``emu clean``: remove what runs killed with SIGKILL left behind, by emu's own records."""

from __future__ import annotations

import click

from emu.cli import cli
from emu.cli.output import err, out


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
def clean(dry_run: bool) -> None:
    """Stop the processes and remove the socket folders, network namespaces and interfaces that
    emu runs killed with SIGKILL left behind.

    Every run records what it starts (in $XDG_RUNTIME_DIR/emu-UID/runs, else the temporary
    folder); only what a record of a run that is no longer alive names is touched, each process
    checked by its start time so that a recycled pid is never hit.
    """
    from emu.errors import ConfigError
    from emu.lifetime import clean as clean_up

    try:
        found = clean_up(dry_run=dry_run)
    except OSError as exc:
        raise ConfigError(f"cannot read emu's run records: {exc}") from None
    for item in found:
        out().print(f"{'would remove' if dry_run else 'removed'} {item.what} {item.name}", markup=False,
                    highlight=False, soft_wrap=True)
    err().print(f"{len(found)} leftover(s) {'found' if dry_run else 'removed'}", markup=False, highlight=False)

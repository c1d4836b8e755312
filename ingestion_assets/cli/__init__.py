"""The `ingest` command: stack (up, down, env, dev, demo), status, state, refresh, partitions, check, schema, dlq,
reconcile."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from ingestion_assets.catalog import CatalogError
from ingestion_assets.cli import cdc, dlq, quality, stack, state, status
from ingestion_assets.errors import SourceUnavailable
from ingestion_assets.references import UnresolvedReference
from ingestion_assets.settings import Settings
from ingestion_assets.sources.tls import TlsError

Handler = Callable[[Settings, argparse.Namespace], int]
# what neither opens Dagster's instance nor brings up the stack: it runs whatever DAGSTER_HOME says
_WITHOUT_INSTANCE = {"env", "down", "check"}


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["dev"]:  # everything after it is `dagster dev`'s (`ingest dev -p 3001`: argparse took -p as ours)
        args = _parser().parse_args(["dev"])
        args.dagster_args = given[1:]
    else:
        args = _parser().parse_args(given)
    settings = Settings.from_env()
    conflict = settings.dagster_home_conflict() if args.uses_instance else None
    if conflict is not None:
        print(f"error: {conflict}", file=sys.stderr)
        return 2
    try:
        return int(args.handler(settings, args) or 0)
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (UnresolvedReference, TlsError, SourceUnavailable) as exc:  # a source's reference or server
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `ingest status | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ingest", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, handler: Handler | None, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler, uses_instance=name not in _WITHOUT_INSTANCE)
        return sub

    def actions(parent: argparse.ArgumentParser) -> Callable[[str, Handler, str], argparse.ArgumentParser]:
        group = parent.add_subparsers(required=True, metavar="ACTION")

        def action(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
            sub = group.add_parser(name, help=help_text, description=help_text)
            sub.set_defaults(handler=handler)
            return sub

        return action

    stack_up = command("up", stack.up, "start the embedded PostgreSQL (Dagster storage, demo source) and print the env")
    stack_up.add_argument("--tls", action="store_true", help="TLS only, client certificates (a throwaway CA)")
    stack_up.add_argument("--pg-bin", help="PostgreSQL binaries to use (a build with OpenSSL, for --tls)")
    stack_up.add_argument("--archive", action="store_true", help="archive WAL for Dagster's storage (PITR)")
    stack_up.add_argument("--standby", action="store_true", help="start a streaming standby of the storage server")
    storage_action = actions(command("storage", None, "Dagster's storage: backups, standby promotion, PITR"))
    storage_action("backup", stack.storage_backup, "archive WAL and take a base backup of the storage server")
    storage_action("promote", stack.storage_promote, "make the standby the storage primary (failover)")
    restore = storage_action("restore", stack.storage_restore, "point-in-time recovery of Dagster's storage")
    restore.add_argument("--to", required=True, help="ISO time (UTC if no offset), at or before the target's own")
    restore.add_argument("--force", action="store_true", help="restore even if checkpoints are ahead of the target")
    restore.add_argument(
        "--include-other-databases",
        action="store_true",
        help="restore even if the embedded server holds other databases (sources, targets): they roll back too",
    )
    restore.add_argument("--timeout", type=float, default=300.0, help="seconds the recovery may take (default 300)")
    command("down", stack.down, "stop the embedded PostgreSQL")
    command("env", stack.env, "print `export` lines that point dagster commands at this instance")
    demo = command("demo", stack.demo, "seed the demo shop, materialize every stream twice, print a summary")
    demo.add_argument("--orders", type=int, default=int(os.environ.get("INGEST_DEMO_ORDERS", "1000000")))
    dev = command("dev", stack.dev, "run the Dagster webserver and daemon on this instance")
    dev.add_argument("dagster_args", nargs=argparse.REMAINDER, help="passed to `dagster dev`")
    overview = command("status", status.status, "each stream: status, rows in target, last run, position, lag")
    overview.add_argument("--json", action="store_true", help="one JSON object per stream, for scripts")
    command("check", quality.check, "validate the catalog, reach every source, find every table and column")

    state_action = actions(command("state", None, "show or reset stream checkpoints"))
    show = state_action("show", state.state_show, "each stream's checkpoint: position, when, which run")
    show.add_argument("stream", nargs="?", help="SOURCE.STREAM (default: all)")
    show.add_argument("--partition")
    reset = state_action("reset", state.state_reset, "clear a checkpoint: the next run re-reads from the start")
    reset.add_argument("stream", help="SOURCE.STREAM")
    reset.add_argument("--partition")

    refresh = command("refresh", state.refresh, "re-read a stream in full as a new generation")
    refresh.add_argument("stream", help="SOURCE.STREAM (not partitioned)")
    refresh.add_argument("--retain", action="store_true", help="merge over the target: rows gone from the source stay")
    refresh.add_argument("--later", action="store_true", help="only mark it: the next scheduled run refreshes")
    plan = actions(command("partitions", None, "backfill partitions"))(
        "plan", state.partitions_plan, "add the key ranges key-partitioned streams now need"
    )
    plan.add_argument("stream", nargs="?", help="SOURCE.STREAM (default: all key-partitioned streams)")

    schema_action = actions(command("schema", None, "schema changes of a stream's source table"))
    schema_show = schema_action("show", quality.schema_show, "stored columns, and what changed in the source since")
    schema_show.add_argument("stream", help="SOURCE.STREAM")
    accept = schema_action("accept", quality.schema_accept, "apply the changes that paused the stream on its next run")
    accept.add_argument("stream", help="SOURCE.STREAM")
    accept.add_argument("--partition")

    cdc_action = actions(command("cdc", None, "the replication slot of a `mode: cdc` source"))
    cdc_action("status", cdc.status, "retained WAL, lag and state of the source's slot").add_argument("source")
    drop = cdc_action("drop-slot", cdc.drop_slot_command, "drop the slot, releasing its WAL (dry run unless --yes)")
    drop.add_argument("source")
    drop.add_argument("--yes", action="store_true", help="drop it: the changes it holds are gone")

    dlq_action = actions(command("dlq", None, "rows parked in the dead-letter table"))
    dlq_list = dlq_action("list", quality.dlq_list, "parked rows of a stream: key, error, when, which run")
    dlq_list.add_argument("stream", help="SOURCE.STREAM")
    replay = dlq_action("replay", quality.dlq_replay, "read parked rows again from the source; loaded ones leave")
    replay.add_argument("stream", help="SOURCE.STREAM")
    discard = dlq_action("discard", dlq.dlq_discard, "close dead letters on purpose (dry run unless --yes); recorded")
    discard.add_argument("stream", help="SOURCE.STREAM")
    chosen = discard.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--key", action="append", help="a parked row's key as `ingest dlq list` prints it (repeatable)")
    chosen.add_argument("--all", action="store_true", help="every dead letter of the stream")
    discard.add_argument("--reason", help="why, kept with the record of the discard")
    discard.add_argument("--yes", action="store_true", help="remove them (without it: only print what would go)")

    compare = command("reconcile", quality.reconcile, "compare a table stream's target with its source now, in full")
    compare.add_argument("stream", help="SOURCE.STREAM")
    compare.add_argument("--partition", help="the partition to compare (partitioned streams)")
    compare.add_argument(
        "--apply-deletes", action="store_true", help="delete rows the source no longer has (soft if the stream says so)"
    )
    compare.add_argument("--every-key", action="store_true", help="diff every key, even where the checksums agree")
    compare.add_argument(
        "--no-repair", action="store_true", help="only compare: do not read missing or older rows again by key"
    )
    compare.add_argument(
        "--source-wins",
        action="store_true",
        help="also read again the rows newer in the target than in the source (its cursor went backwards: a restore, "
        "a hand edit) and load the source's version over them",
    )
    return parser


if __name__ == "__main__":
    raise SystemExit(main())

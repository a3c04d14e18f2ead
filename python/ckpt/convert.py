"""python -m ckpt.convert: move checkpoints between torch.distributed.checkpoint's own format
(FileSystemWriter's directory: .metadata and *.distcp) and ckpt.

    python -m ckpt.convert import DCP_DIR CKPT_DIR [--overwrite] [--compress zstd]
    python -m ckpt.convert export CKPT_DIR DCP_DIR

import reads one tensor at a time (memory: the largest tensor) and writes a FULL ckpt
checkpoint; DCP's non-tensor values stay DCP pickles (bytes entries, listed in the user
metadata), so dcp.load through ckpt.torch.StorageReader gives them back as they were.
export loads the whole state into memory and saves it with DCP's FileSystemWriter.
Exit codes: 0 done, 1 error, 2 usage.
"""
import argparse
import io
import json
import os
import sys

import ckpt


def _dcp_modules():
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    return torch, dcp, DefaultLoadPlanner, BytesStorageMetadata


def import_dcp(src, dst, overwrite=False, compression=None):
    """DCP directory `src` -> ckpt checkpoint `dst`; returns the number of keys written."""
    torch, dcp, DefaultLoadPlanner, BytesStorageMetadata = _dcp_modules()
    from ckpt.torch import USER_KEY
    reader = dcp.FileSystemReader(src)
    md = reader.read_metadata()
    keys = list(md.state_dict_metadata)
    pickled = sorted(k for k in keys if isinstance(md.state_dict_metadata[k], BytesStorageMetadata))
    user = {USER_KEY: {"pickled": pickled, "planner_data": None}, "converted_from": "dcp"}
    with ckpt.Writer(dst, state_dict_type="FULL", overwrite=overwrite, compression=compression,
                     user_metadata=user) as w:
        for key in keys:
            meta = md.state_dict_metadata[key]
            if isinstance(meta, BytesStorageMetadata):
                state = {key: None}
            else:
                state = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)}
            # One key per load (the key is DCP's flattened name already); the planner
            # tolerates the keys left out. (Without flattening, DCP's planner would not put
            # loaded non-tensor values back into `state`.)
            dcp.load(state, storage_reader=dcp.FileSystemReader(src), no_dist=True,
                     planner=DefaultLoadPlanner(allow_partial_load=True))
            value = state[key]
            if isinstance(meta, BytesStorageMetadata):
                buf = io.BytesIO()
                torch.save(value, buf)
                w.write(key, buf.getvalue())
            else:
                w.write(key, value)
            del state, value
    return len(keys)


def export_dcp(src, dst):
    """ckpt checkpoint `src` -> DCP directory `dst`; returns the number of keys written."""
    torch, dcp, _, _ = _dcp_modules()
    import ckpt.torch
    with ckpt.open(src) as c:
        state = {}
        for key in c.keys():
            e = c.entry(key)
            state[key] = (torch.empty(e["shape"], dtype=getattr(torch, e["dtype"])) if e["kind"] == "tensor"
                          else None)
    dcp.load(state, storage_reader=ckpt.torch.StorageReader(src), no_dist=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(dst), no_dist=True)
    return len(state)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ckpt.convert", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    imp = sub.add_parser("import", help="DCP directory -> ckpt checkpoint")
    imp.add_argument("src")
    imp.add_argument("dst")
    imp.add_argument("--overwrite", action="store_true", help="replace a committed checkpoint at DST")
    imp.add_argument("--compress", choices=["none", "zstd"], default="none")
    exp = sub.add_parser("export", help="ckpt checkpoint -> DCP directory")
    exp.add_argument("src")
    exp.add_argument("dst")
    args = p.parse_args(argv)
    try:
        if args.cmd == "import":
            if not os.path.isfile(os.path.join(args.src, ".metadata")):
                raise ckpt.Error("not found", f"{args.src}: not a DCP checkpoint (no .metadata)", args.src)
            n = import_dcp(args.src, args.dst, args.overwrite, None if args.compress == "none" else args.compress)
        else:
            if os.path.exists(args.dst) and os.listdir(args.dst):
                raise ckpt.Error("already exists", f"{args.dst}: not empty", args.dst)
            n = export_dcp(args.src, args.dst)
    except ckpt.Error as e:
        print(f"ckpt.convert: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 (DCP's own failures: reported, exit 1)
        print(f"ckpt.convert: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"keys": n, "from": args.src, "to": args.dst}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m ckpt.convert: move checkpoints between torch.distributed.checkpoint's own format
(FileSystemWriter's directory: .metadata and *.distcp) and ckpt.

    python -m ckpt.convert import DCP_DIR CKPT_DIR [--overwrite] [--compress zstd]
    python -m ckpt.convert export CKPT_DIR DCP_DIR [--allow-pickle]

import reads one tensor at a time (memory: the largest tensor) and writes a FULL ckpt
checkpoint; DCP's non-tensor values are copied as the pickles they are (bytes entries,
listed in the user metadata), never unpickled, so dcp.load through ckpt.torch.StorageReader
gives them back as they were, through its restricted unpickler.
export loads the whole state into memory (non-tensor values through ckpt.torch.StorageReader's
restricted unpickler: a pickle of another type is refused, naming the key, unless
--allow-pickle, which runs code from the checkpoint) and saves it with DCP's FileSystemWriter.
Exit codes: 0 done, 1 error, 2 usage.
"""
import argparse
import json
import os
import pickle
import sys

import ckpt


def _dcp_modules():
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    return torch, dcp, DefaultLoadPlanner, BytesStorageMetadata


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's .metadata (FileSystemWriter's pickle of its Metadata) allowing only
    the classes such a file holds: FileSystemReader's own pickle.load would run whatever
    code a crafted .metadata holds."""

    _DCP = {"torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "StorageMeta", "MetadataIndex", "_MEM_FORMAT_ENCODING"},
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "collections": {"OrderedDict"},
        "torch.serialization": {"_get_layout"},
        "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}}

    def find_class(self, module, name):
        import torch
        if name in self._DCP.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if value is torch.Size or isinstance(value, (torch.dtype, torch.memory_format)):
                return value
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not one DCP's metadata holds")


def _dcp_reader(dcp, path):
    """dcp.FileSystemReader(path) whose read_metadata unpickles .metadata restrictedly."""
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(dcp.FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            md_path = os.path.join(os.fspath(self.path), ".metadata")
            try:
                with open(md_path, "rb") as f:
                    md = _MetadataUnpickler(f).load()
            except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
                raise ckpt.Error("unsupported", f"{md_path}: not DCP metadata ckpt unpickles ({e}): unpickling it "
                                 "could run code from the checkpoint", md_path) from None
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    return Reader(path)


def _raw_bytes_planner(DefaultLoadPlanner):
    """A DefaultLoadPlanner that keeps the bytes of DCP's non-tensor values as stored
    (`raw[key]`) instead of unpickling them (DefaultLoadPlanner's torch.load(weights_only=False)
    would run whatever code a crafted pickle holds)."""
    class RawBytesPlanner(DefaultLoadPlanner):
        def __init__(self):
            super().__init__(allow_partial_load=True)
            self.raw = {}

        def load_bytes(self, read_item, value):
            self.raw[read_item.dest_index.fqn] = value.read()

    return RawBytesPlanner()


def import_dcp(src, dst, overwrite=False, compression=None):
    """DCP directory `src` -> ckpt checkpoint `dst`; returns the number of keys written."""
    torch, dcp, DefaultLoadPlanner, BytesStorageMetadata = _dcp_modules()
    from ckpt.torch import USER_KEY
    md = _dcp_reader(dcp, src).read_metadata()
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
            # tolerates the keys left out, and keeps a pickle's bytes as they are.
            planner = _raw_bytes_planner(DefaultLoadPlanner)
            dcp.load(state, storage_reader=_dcp_reader(dcp, src), no_dist=True, planner=planner)
            w.write(key, planner.raw[key] if isinstance(meta, BytesStorageMetadata) else state[key])
            del state, planner
    return len(keys)


def export_dcp(src, dst, allow_pickle=False):
    """ckpt checkpoint `src` -> DCP directory `dst`; returns the number of keys written.
    allow_pickle: see ckpt.torch.StorageReader (True runs code from the checkpoint)."""
    torch, dcp, _, _ = _dcp_modules()
    import ckpt.torch
    with ckpt.open(src) as c:
        state = {}
        for key in c.keys():
            e = c.entry(key)
            state[key] = (torch.empty(e["shape"], dtype=getattr(torch, e["dtype"])) if e["kind"] == "tensor"
                          else None)
    dcp.load(state, storage_reader=ckpt.torch.StorageReader(src, allow_pickle=allow_pickle), no_dist=True)
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
    exp.add_argument("--allow-pickle", action="store_true",
                     help="unpickle non-tensor values of any type: RUNS CODE FROM THE CHECKPOINT")
    args = p.parse_args(argv)
    try:
        if args.cmd == "import":
            if not os.path.isfile(os.path.join(args.src, ".metadata")):
                raise ckpt.Error("not found", f"{args.src}: not a DCP checkpoint (no .metadata)", args.src)
            n = import_dcp(args.src, args.dst, args.overwrite, None if args.compress == "none" else args.compress)
        else:
            if os.path.exists(args.dst) and os.listdir(args.dst):
                raise ckpt.Error("already exists", f"{args.dst}: not empty", args.dst)
            n = export_dcp(args.src, args.dst, args.allow_pickle)
    except ckpt.Error as e:
        print(f"ckpt.convert: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 (DCP's own failures: reported, exit 1)
        print(f"ckpt.convert: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        if type(e).__name__ != "CheckpointException":
            raise
        print(f"ckpt.convert: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"keys": n, "from": args.src, "to": args.dst}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

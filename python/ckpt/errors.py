"""ckpt.Error: every failure of the ckpt package, carrying libckpt's error code, file and key."""
import re

# libckpt's ErrorCodeName, the values of Error.code.
CODES = ("invalid argument", "not found", "already exists", "I/O error", "corrupt", "mismatch",
         "unsupported", "communication error", "internal error", "cancelled", "changed while reading")

_KEY = re.compile(r"(?:key|tensor|entry) '((?:[^']|'(?=[^:\s,)]))*)'")
_FILE = re.compile(r"([^\s:'\"()]+\.h5|[^\s:'\"()]*metadata\.json)")
_PATH = re.compile(r"^(/[^:]+):")
# An object-store URL: up to the ": " (or end, or space) that ends it.
_URL = re.compile(r"(s3://[^\s'\"()]+?)(?=:?(?:\s|$)|[,;)])")


class Error(Exception):
    """A ckpt failure.

    code: libckpt's error code name ("corrupt", "not found", "mismatch", ... see CODES);
    file: the checkpoint file or directory (or s3:// object or prefix) the message names, or None;
    key: the state-dict key the message names, or None.
    """

    def __init__(self, code, message, file=None, key=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.file = file
        self.key = key

    def __str__(self):
        return f"[{self.code}] {self.message}"

    def __reduce__(self):
        # Pickled with everything it carries: DCP sends a rank's exception to the others
        # (CheckpointException), and the default, Error(*args), would lose code, file and key.
        return (type(self), (self.code, self.message, self.file, self.key), self.__dict__)


def _from_native(code, message):
    """Builds the Error for a ckpt::Error (called by the bindings): file and key are read
    from libckpt's message, which names them as `path: ...` and `key 'name'`."""
    key = _KEY.search(message)
    file = _URL.search(message) or _FILE.search(message) or _PATH.search(message)
    return Error(code, message, file.group(1) if file else None, key.group(1) if key else None)

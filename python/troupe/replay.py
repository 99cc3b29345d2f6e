"""The replay client: troupe.replay.Client("host:port") talks to a replay
server (`troupe replay`, a learner's embedded replay, or troupe.replay.Server).

    client = troupe.replay.Client("127.0.0.1:7000", certs_dir="certs")
    client.insert("transitions", {"observation": obs, "action": a, ...}, priority=1.0)
    batch = client.sample("transitions", batch_size=256)   # batch.data["observation"], batch.keys, ...

Pixel fields (a table field with `frames` > 0) travel as frames, each sent
and stored once: a Writer's append_frame() returns a key, and items name
their frames by key (troupe.replay.Frames), as the C++ writer does; a
pixel field given as an array uint8 [frames, H, W, C] is appended frame by
frame. Sampled pixel fields come back decoded, uint8 [B, frames, H, W, C].

Security (common/grpc_security.h): certs_dir (ca.pem, client.pem,
client.key, token as `troupe certs` writes them) or the files one by one;
the token from `token`, else $TROUPE_TOKEN, else token_file / certs_dir's
token. Beyond loopback without TLS is refused unless insecure=True.
"""
from __future__ import annotations

import json
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence

import numpy as np

from troupe import _native


class Frames(tuple):
    """A pixel field's value in an item: the keys of frames already appended."""

    def __new__(cls, keys: Iterable[int]):
        return super().__new__(cls, (int(k) for k in keys))


class Sample(NamedTuple):
    """A sampled batch: `data` maps each field of the table to [B, ...] arrays."""
    keys: np.ndarray           # uint64 [B]
    probabilities: np.ndarray  # float64 [B]
    weights: np.ndarray        # float32 [B], importance weights (1 unless prioritized)
    table_size: int
    data: Dict[str, np.ndarray]


def _security(certs_dir, ca_cert, client_cert, client_key, token_file, server_name, insecure,
              server_cert=None, server_key=None, mutual_tls=False) -> str:
    fields = {"certs_dir": certs_dir, "ca_cert": ca_cert, "client_cert": client_cert, "client_key": client_key,
              "token_file": token_file, "server_name": server_name, "server_cert": server_cert,
              "server_key": server_key}
    config = {k: str(v) for k, v in fields.items() if v}
    if insecure:
        config["insecure"] = True
    if mutual_tls:
        config["mutual_tls"] = True
    return json.dumps(config)


class _Field(NamedTuple):
    name: str
    dtype: np.dtype
    shape: tuple
    frames: int


def _signature(table_config: dict) -> List[_Field]:
    return [_Field(f["name"], np.dtype(f.get("dtype", "float32")), tuple(int(d) for d in f.get("shape", [])),
                   int(f.get("frames", 0))) for f in table_config.get("fields", [])]


class Writer:
    """An insert stream (one gRPC stream); frames are sent once each. Close it (or use `with`)."""

    def __init__(self, client: "Client", native: _native.ReplayWriter):
        self._client = client
        self._native = native

    def append_frame(self, pixels) -> int:
        """Queues one uint8 [H, W, C] frame; returns its key for Frames([...])."""
        return self._native.append_frame(pixels)

    def insert(self, table: str, item: dict, priority: float = 1.0) -> None:
        """Queues one item: a value per field of the table's signature (dense:
        an array, cast to the field's dtype; pixels: Frames, or uint8
        [frames, H, W, C] appended here). Sent in batches; flush() waits."""
        fields = []
        signature = self._client._signature(table)
        missing = [f.name for f in signature if f.name not in item]
        extra = [k for k in item if k not in {f.name for f in signature}]
        if missing or extra:
            raise _native.InvalidArgumentError(
                f"item for table '{table}': missing fields {missing}, unknown fields {extra}; "
                f"the table's fields: {[f.name for f in signature]}")
        for field in signature:
            value = item[field.name]
            if field.frames > 0 and not isinstance(value, Frames):
                frames = np.asarray(value, dtype=np.uint8)
                if frames.ndim != 4:
                    raise _native.InvalidArgumentError(
                        f"field '{field.name}' (table '{table}'): a pixel field is Frames(keys) or uint8 "
                        f"[frames, H, W, C]; got shape {frames.shape}")
                value = Frames(self._native.append_frame(frame) for frame in frames)
            if isinstance(value, Frames):
                fields.append(list(value))
            else:
                fields.append(np.require(np.asarray(value, dtype=field.dtype), requirements="C"))  # 0-d stays 0-d
        self._native.insert(table, float(priority), fields)

    def flush(self) -> None:
        """Sends what is queued and waits until it is in its tables."""
        self._native.flush()

    def close(self) -> None:
        """Flushes and ends the stream. Idempotent."""
        self._native.close()

    @property
    def items_sent(self) -> int:
        return self._native.items_sent

    @property
    def bytes_sent(self) -> int:
        return self._native.bytes_sent

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()


class Client:
    """A replay client over gRPC. Connects lazily: an unreachable server
    raises troupe.UnavailableError (a ConnectionError) from the first call."""

    def __init__(self, address: str, *, certs_dir: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, ca_cert: Optional[str] = None, client_cert: Optional[str] = None,
                 client_key: Optional[str] = None, server_name: Optional[str] = None, insecure: bool = False,
                 max_message_bytes: int = 64 << 20):
        self.address = address
        self._native = _native.ReplayClient(
            address, _security(certs_dir, ca_cert, client_cert, client_key, token_file, server_name, insecure),
            token or "", max_message_bytes)
        self._signatures: Dict[str, List[_Field]] = {}
        self._samplers: dict = {}
        self._writer: Optional[Writer] = None

    def info(self) -> dict:
        """The server's tables (config, size, rate limiter) and frame store, as a dict
        (proto/replay.proto InfoResponse; 64-bit integers as strings, as protobuf's JSON has them)."""
        return json.loads(self._native.info())

    def _signature(self, table: str) -> List[_Field]:
        if table not in self._signatures:
            tables = {t["config"]["name"]: t["config"] for t in self.info().get("tables", [])}
            if table not in tables:
                raise _native.NotFoundError(f"unknown table '{table}'; tables: {', '.join(sorted(tables))}")
            self._signatures[table] = _signature(tables[table])
        return self._signatures[table]

    def writer(self, codec: str = "lz4", compression_level: int = 1, frame_window: int = 64,
               max_items_per_request: int = 16, reference_frames: bool = True) -> Writer:
        """A new insert stream (see Writer)."""
        return Writer(self, self._native.new_writer(codec, compression_level, frame_window, max_items_per_request,
                                                    reference_frames))

    def insert(self, table: str, item: dict, priority: float = 1.0) -> None:
        """Inserts one item and waits until it is in the table (blocking on the
        rate limiter). For many items a writer() is faster."""
        if self._writer is None:
            self._writer = self.writer()
        try:
            self._writer.insert(table, item, priority)
            self._writer.flush()
        except _native.Error:
            self._writer = None  # its stream may be broken: the next insert opens another
            raise

    def sample(self, table: str, batch_size: int, timeout: Optional[float] = None) -> Sample:
        """A batch of `batch_size` items (blocking on the rate limiter up to
        `timeout` seconds, then troupe.DeadlineExceededError)."""
        key = (table, batch_size, timeout)
        if key not in self._samplers:
            self._samplers[key] = self._native.new_sampler(table, batch_size, 0.0 if timeout is None else timeout)
        names = [f.name for f in self._signature(table)]
        keys, probabilities, weights, table_size, fields = self._samplers[key].next()
        return Sample(keys, probabilities, weights, table_size, dict(zip(names, fields)))

    def mutate_priorities(self, table: str, keys: Sequence[int], priorities: Sequence[float]) -> int:
        """Sets the priority of each key; returns how many keys were no longer in the table."""
        keys = [int(k) for k in np.asarray(keys).ravel()]
        priorities = [float(p) for p in np.asarray(priorities).ravel()]
        if len(keys) != len(priorities):
            raise _native.InvalidArgumentError(f"mutate_priorities: {len(keys)} keys but {len(priorities)} priorities")
        return self._native.mutate_priorities(table, keys, priorities)

    def checkpoint(self, path: str) -> int:
        """The server writes every table to `path`; returns bytes written."""
        return self._native.checkpoint(path)

    def restore(self, path: str) -> int:
        """The server replaces its tables' contents with the checkpoint; returns items restored."""
        return self._native.restore(path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._samplers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Server:
    """A replay server in this process (replay::Server): `config` is a
    ReplayConfig (proto/config.proto) as a dict or in protobuf text format.
    Listens on config's `listen` (default 127.0.0.1, a free port: see .address)."""

    def __init__(self, config, *, certs_dir: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, server_cert: Optional[str] = None,
                 server_key: Optional[str] = None, ca_cert: Optional[str] = None, mutual_tls: bool = False,
                 insecure: bool = False):
        text = json.dumps(config) if isinstance(config, dict) else str(config)
        self._native = _native.ReplayServer(
            text, _security(certs_dir, ca_cert, None, None, token_file, None, insecure, server_cert, server_key,
                            mutual_tls), token or "")

    @property
    def address(self) -> str:
        return self._native.address

    @property
    def port(self) -> int:
        return self._native.port

    def shutdown(self) -> None:
        self._native.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

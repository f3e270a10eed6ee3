"""Several hosts on one machine, for the pool route's tests (tests/test_hosts.py): Linux network namespaces.

Host A is a namespace running Prefect servers (one per scenario, each with its own database), an SSH server (Debian's
openssh-server) that serves the git repositories and the DVC remotes, and the coordinators. Each worker host is a
namespace of its own joined to A by a veth pair: it reaches A only at A's address on that pair (A forwards nothing).
A management link from the test's own namespace to A carries the test's Prefect API calls. Every process the lab
starts runs in one of its namespaces, with its Prefect, DVC, HF and SSH state under the lab's temporary folder;
:meth:`Lab.close` kills them and deletes the namespaces with their links, also when a test failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SSHD = "/usr/sbin/sshd"
FIRST_PORT = 4200  # the Prefect servers' ports on A
HEARTBEAT_S = 3  # worker heartbeats: Prefect calls a worker offline after three missed ones
# The hosts where no fault is staged (B of the toy DAG and the pipeline slice, the GPU hosts): on a loaded 2-core host
# 3 s heartbeats starved for 9-12 s, live workers were taken for lost and their stages submitted twice (CI's runner
# is slower still); offline after 60 s instead.
STEADY_HEARTBEAT_S = 20
# A Prefect server keeps its state in SQLite, which takes one writer at a time: with all scenarios on one server, two
# busy cores and a dozen workers, coordinators and flow runs, heartbeats failed on "database is locked" for 20 s and
# live workers looked dead. So the scenarios are spread over four servers (tests/test_hosts.py), and the writes nobody
# reads here (events, run logs, schedules, automations) are off.
SERVER_SETTINGS = {f"PREFECT_SERVER_SERVICES_{s}_ENABLED": "false"
                   for s in ("SCHEDULER", "LATE_RUNS", "TRIGGERS", "EVENT_PERSISTER", "DB_VACUUM", "PAUSE_EXPIRATIONS")}
# The server marks a worker offline in its foreman's loop (every 15 s by default), after three missed heartbeats.
SERVER_SETTINGS["PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS"] = "1"
QUIET_CLIENT = {"PREFECT_LOGGING_TO_API_ENABLED": "false"}  # run logs stay in each process's output (logs/)
_PREFIX = "llmrl"  # namespaces are named llmrl<pid>-<host>


def unavailable() -> str | None:
    """Why the lab cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and veth pairs)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"{_PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if not os.access(SSHD, os.X_OK):
        return f"no {SSHD} (Debian's openssh-server; `make openssh` installs it)"
    return None


def _ip(*args: str, ns: str | None = None) -> str:
    proc = subprocess.run(["ip", *(["-n", ns] if ns else []), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}`{f' in {ns}' if ns else ''} failed: {proc.stderr.strip()}")
    return proc.stdout


def _pids(ns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _kill_namespace(ns: str, grace_s: float = 0.0) -> None:
    """Every process in namespace ``ns`` (the lab started them all): SIGTERM first when ``grace_s``, then SIGKILL."""
    if grace_s:
        for pid in _pids(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
    for _ in range(50):  # a dying process may still spawn one
        left = _pids(ns)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def clean_stale_namespaces() -> None:
    """Namespaces an earlier run of these tests left behind when it was killed (its pid is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in re.findall(rf"^({_PREFIX}(\d+)-\S+)", listed, flags=re.M):
        ns, pid = name[0], int(name[1])
        try:
            os.kill(pid, 0)
            continue  # its run is still going
        except ProcessLookupError:
            pass
        _kill_namespace(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def state_env(home: Path) -> dict[str, str]:
    """This process's environment with every tool's state (Prefect, DVC, HF, SSH, caches) under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DVC_", "HF_", "LLMRL_", "GIT_"))}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(home), PREFECT_HOME=str(home / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false", HF_HOME=str(home / "hf"),
        HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", XDG_CACHE_HOME=str(home / "xdg"),
        MPLCONFIGDIR=str(home / "matplotlib"), TOKENIZERS_PARALLELISM="false", DVC_NO_ANALYTICS="1",
        DVC_GLOBAL_CONFIG_DIR=str(home / "dvc-global"), DVC_SYSTEM_CONFIG_DIR=str(home / "dvc-system"),
        DVC_SITE_CACHE_DIR=str(home / "dvc-site"),
    )
    home.mkdir(parents=True, exist_ok=True)
    return env


@dataclass
class Server:
    """A Prefect server on A: its port, its state folder, and its API as the test reaches it (management link)."""

    port: int
    home: Path
    api: str

    def api_for(self, host: "Host | None") -> str:
        """The API URL from a worker host (through its link), or from A itself (None)."""
        return f"http://{host.a_addr if host else '127.0.0.1'}:{self.port}/api"

    def client(self):
        """A Prefect client of this server (over the management link)."""
        from prefect.client.orchestration import SyncPrefectClient

        return SyncPrefectClient(self.api)


@dataclass
class Host:
    """A worker host: namespace ``ns``, joined to A by the veth pair (A's ``a_link`` at ``a_addr``, its ``to-a``)."""

    name: str
    ns: str
    home: Path
    a_addr: str
    a_link: str
    procs: list = field(default_factory=list)

    def env(self, server: Server, **extra: str) -> dict[str, str]:
        """A worker's environment on this host: ``server``'s API through the link, frequent heartbeats, git and DVC
        reaching A's SSH server as ``hosta`` (this host's ~/.ssh/config)."""
        env = state_env(self.home)
        env.update(PREFECT_API_URL=server.api_for(self),
                   PREFECT_WORKER_HEARTBEAT_SECONDS=str(HEARTBEAT_S), PREFECT_WORKER_QUERY_SECONDS="3", **QUIET_CLIENT,
                   LLMRL_WORKER_DIR=str(self.home / "work"),
                   GIT_SSH_COMMAND=f"ssh -F {self.home / '.ssh' / 'config'}")
        env.update(extra)  # may override the defaults above (a longer heartbeat where no fault is staged)
        return env


class Lab:
    """Host A and worker hosts, see the module's docstring. ``start`` brings A up; ``add_host`` joins a host."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.tag = f"{_PREFIX}{os.getpid()}"
        self.a_ns = f"{self.tag}-a"
        self.namespaces: list[str] = []
        self.hosts: dict[str, Host] = {}
        self.procs: list[subprocess.Popen] = []
        self.servers: list[Server] = []
        self.shared: dict = {}  # what several scenarios use, set up by the first
        self._logs: list = []
        n = os.getpid() % 16384  # the management link's /30, distinct between concurrent runs
        self._mgmt = (f"10.250.{n // 64}.{(n % 64) * 4 + 1}", f"10.250.{n // 64}.{(n % 64) * 4 + 2}")
        self._mgmt_link = f"lm{os.getpid()}"[:15]
        self.keys = tmp / "keys"

    # --- lifecycle ---

    def _namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("link", "set", "lo", "up", ns=name)

    def start(self) -> None:
        """A with its SSH server and the management link; no Prefect server yet (:meth:`server`)."""
        clean_stale_namespaces()
        self._namespace(self.a_ns)
        _ip("link", "add", "mgmt", "netns", self.a_ns, "type", "veth", "peer", "name", self._mgmt_link)
        _ip("addr", "add", f"{self._mgmt[0]}/30", "dev", self._mgmt_link)
        _ip("link", "set", self._mgmt_link, "up")
        _ip("addr", "add", f"{self._mgmt[1]}/30", "dev", "mgmt", ns=self.a_ns)
        _ip("link", "set", "mgmt", "up", ns=self.a_ns)
        self._start_sshd()

    def server(self, name: str, ready_s: float = 180.0) -> Server:
        """A Prefect server on A (listening on all of A's addresses), answering."""
        port = FIRST_PORT + len(self.servers)
        server = Server(port, self.tmp / "a" / f"prefect-{name}", f"http://{self._mgmt[1]}:{port}/api")
        self.servers.append(server)
        env = dict(state_env(server.home), **SERVER_SETTINGS)
        self.run_in(self.a_ns, [str(BIN / "prefect"), "server", "start", "--host", "0.0.0.0", "--port", str(port)],
                    env, f"prefect-{name}")
        deadline = time.monotonic() + ready_s
        while True:
            try:
                urllib.request.urlopen(f"{server.api}/health", timeout=2)
                return server
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Prefect server {name} on {self.a_ns} did not answer within {ready_s:g} s; "
                                       f"see {self.tmp / 'logs' / f'prefect-{name}.log'}")
                time.sleep(0.5)

    def _start_sshd(self) -> None:
        d = self.tmp / "a" / "sshd"
        d.mkdir(parents=True)
        self.keys.mkdir()
        for key in (d / "host_key", self.keys / "id_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        shutil.copy(self.keys / "id_ed25519.pub", d / "authorized_keys")
        (d / "sshd_config").write_text(
            f"ListenAddress 0.0.0.0:22\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            # the temporary folder's parents (/tmp) are world-writable, which StrictModes refuses
            "StrictModes no\nUsePAM no\nPidFile none\nSubsystem sftp internal-sftp\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        self.run_in(self.a_ns, [SSHD, "-D", "-e", "-f", str(d / "sshd_config")], state_env(self.tmp / "a"), "sshd")

    def add_host(self, name: str) -> Host:
        """A worker host: its namespace, its veth pair to A (10.77.<i>.0/24), its SSH client settings for ``hosta``."""
        index = len(self.hosts) + 1
        ns = f"{self.tag}-{name}"
        if len(f"to-{name}") > 15:
            raise ValueError(f"host name {name!r} too long for an interface name (to-<name>, 15 characters)")
        self._namespace(ns)
        a_link, a_addr, addr = f"to-{name}", f"10.77.{index}.1", f"10.77.{index}.2"
        _ip("link", "add", a_link, "netns", self.a_ns, "type", "veth", "peer", "name", "to-a", "netns", ns)
        _ip("addr", "add", f"{a_addr}/24", "dev", a_link, ns=self.a_ns)
        _ip("addr", "add", f"{addr}/24", "dev", "to-a", ns=ns)
        _ip("link", "set", a_link, "up", ns=self.a_ns)
        _ip("link", "set", "to-a", "up", ns=ns)
        home = self.tmp / name
        ssh = home / ".ssh"
        ssh.mkdir(parents=True)
        ssh.chmod(0o700)
        host_key = (self.tmp / "a" / "sshd" / "host_key.pub").read_text().split()[:2]
        (ssh / "known_hosts").write_text(f"{a_addr} {' '.join(host_key)}\n")
        # OpenSSH (git) and asyncssh (DVC's SSH remote) both read this; the keepalive bounds a transfer over a dead link
        (ssh / "config").write_text(
            f"Host hosta\n  HostName {a_addr}\n  User root\n  IdentityFile {self.keys / 'id_ed25519'}\n"
            f"  UserKnownHostsFile {ssh / 'known_hosts'}\n  StrictHostKeyChecking yes\n  ConnectTimeout 5\n"
            "  ServerAliveInterval 2\n  ServerAliveCountMax 3\n")
        (ssh / "config").chmod(0o600)
        host = Host(name, ns, home, a_addr, a_link)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        for ns in reversed(self.namespaces):
            _kill_namespace(ns, grace_s=2.0)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # outside the namespaces (none should be): left to its parent
                pass
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self._mgmt_link], capture_output=True)  # else gone with A, later
        for log in self._logs:
            log.close()

    # --- processes ---

    def run_in(self, ns: str, args: list[str], env: dict[str, str], log: str, cwd: Path = ROOT) -> subprocess.Popen:
        """Start ``args`` in namespace ``ns``, its output appended to ``logs/<log>.log``."""
        (self.tmp / "logs").mkdir(exist_ok=True)
        handle = open(self.tmp / "logs" / f"{log}.log", "a")
        self._logs.append(handle)
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *args], cwd=cwd, env=env, stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.tmp / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def start_worker(self, server: Server, host: Host, pool: str, limit: int = 1, gpus: int = 0,
                     **env: str) -> subprocess.Popen:
        """``pipelines/hosts.py worker`` on ``host`` for ``server``'s ``pool`` (declaring ``gpus`` GPUs)."""
        args = [sys.executable, str(ROOT / "pipelines" / "hosts.py"), "worker", "--pool", pool, "--name", host.name,
                "--limit", str(limit), *(["--gpus", str(gpus)] if gpus else [])]
        proc = self.run_in(host.ns, args, host.env(server, **env), f"{host.name}-{pool}")
        host.procs.append(proc)
        return proc

    def stop_workers(self, host: Host) -> None:
        """Stop ``host``'s worker launchers as an operator would (SIGTERM: they withdraw their GPUs), then whatever
        they left in its namespace."""
        for proc in host.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in host.procs:
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                pass
        self.kill_host(host)

    def kill_host(self, host: Host) -> None:
        """The host dies: every process in its namespace killed at once, nothing told."""
        _kill_namespace(host.ns)
        for proc in host.procs:
            proc.wait(timeout=10)
        host.procs.clear()

    def coordinator(self, server: Server, args: list[str], cwd: Path, log: str, **env: str) -> subprocess.Popen:
        """``pipelines/reproduce.py ARGS`` on A, with ``server``'s API."""
        full = state_env(self.tmp / "a" / f"coordinator-{log}")
        full.update(PREFECT_API_URL=server.api_for(None), **QUIET_CLIENT, **env)
        return self.run_in(self.a_ns, [sys.executable, str(ROOT / "pipelines" / "reproduce.py"), *args], full, log,
                           cwd=cwd)

    # --- the network ---

    def set_link(self, host: Host, up: bool) -> None:
        """A's side of ``host``'s veth pair down (packets to and from the host vanish) or up again."""
        _ip("link", "set", host.a_link, "up" if up else "down", ns=self.a_ns)

    def throttle(self, host: Host, rate: str | None) -> None:
        """Limit what ``host`` sends to A to ``rate`` (a token bucket on its side of the pair); None lifts it."""
        if rate is None:
            subprocess.run(["tc", "-n", host.ns, "qdisc", "del", "dev", "to-a", "root"], capture_output=True)
        else:
            subprocess.run(["tc", "-n", host.ns, "qdisc", "replace", "dev", "to-a", "root", "tbf", "rate", rate,
                            "burst", "32kbit", "latency", "400ms"], check=True, capture_output=True)

    def ssh_url(self, path: Path) -> str:
        """``path`` on A as the worker hosts reach it."""
        return f"ssh://hosta{path}"

    @staticmethod
    def deploy(server: Server, pool: str) -> str:
        """A process work pool ``pool`` on ``server`` and the project's ``stage`` deployment on it (as prefect.yaml's
        ``stage``: the flow runs in this project's folder); its name."""
        from prefect.client.schemas.actions import WorkPoolCreate

        with server.client() as client:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            flow_id = client.create_flow_from_name("llmrl-stage")
            client.create_deployment(
                flow_id=flow_id, name=pool, work_pool_name=pool, entrypoint="pipelines/reproduce.py:run_stage_flow",
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}])
        return f"llmrl-stage/{pool}"


def partial_objects(remote: Path) -> list[str]:
    """Objects of a DVC remote whose content does not hash to their name (DVC's temporary names, ``.*.tmp``, are no
    objects: it renames a file into place once it is whole)."""
    bad = []
    for path in sorted((remote / "files" / "md5").rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            oid = (path.parent.name + path.name).removesuffix(".dir")
            if hashlib.md5(path.read_bytes()).hexdigest() != oid:
                bad.append(str(path.relative_to(remote)))
    return bad


def temporary_files(remote: Path) -> list[str]:
    return sorted(str(p.relative_to(remote)) for p in remote.rglob(".*.tmp"))


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of a workspace (its DVC cache included) but git's and DVC's scratch: what a failure must not touch."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith((".git/", ".dvc/tmp/")):
            files[rel] = path.read_bytes()
    return files

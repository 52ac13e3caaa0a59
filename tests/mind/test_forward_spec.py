"""`mind forward -L` on this side (issue 37, DESIGN §18), in-process, no Mind and no Hand: the spec
parser (ssh -L's forms, IPv6 in brackets, a Unix socket on the Hand, every bad form with its message),
the command's usage errors (exit 2 before anything is opened: a bad spec, a port in use), and the
local machinery (`LocalForward`) driven by a fake client whose `forward` runs echo: bytes exact both
ways, half-close, a refused destination resets the connection and says one line, the listener goes on,
a slow local reader holds the run back, closing cancels the runs. The real Mind and Hand are in
tests/integration/test_forward.py."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mind.cli import exits
from mind.client.forward import (
    ForwardConnection,
    ForwardError,
    ForwardSpec,
    LocalForward,
    bind_listener,
    make_spec,
    open_forward,
    parse_spec,
)
from mind.errors import ClientCode
from mind.main import command
from protocol.codes import RejectCode
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

# --- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("5432:localhost:5432", ForwardSpec("127.0.0.1", 5432, host="localhost", port=5432)),
        ("0:127.0.0.1:80", ForwardSpec("127.0.0.1", 0, host="127.0.0.1", port=80)),
        ("0.0.0.0:8080:db.internal:5432", ForwardSpec("0.0.0.0", 8080, host="db.internal", port=5432)),
        ("*:8080:db:5432", ForwardSpec("0.0.0.0", 8080, host="db", port=5432)),
        ("localhost:8080:db:5432", ForwardSpec("localhost", 8080, host="db", port=5432)),
        ("65535:h:65535", ForwardSpec("127.0.0.1", 65535, host="h", port=65535)),
        ("[::1]:8080:[::1]:80", ForwardSpec("::1", 8080, host="::1", port=80)),
        ("8080:[fe80::1%eth0]:80", ForwardSpec("127.0.0.1", 8080, host="fe80::1%eth0", port=80)),
        ("[::]:0:my_host-1.lan:22", ForwardSpec("::", 0, host="my_host-1.lan", port=22)),
        ("8080:/run/app.sock", ForwardSpec("127.0.0.1", 8080, path="/run/app.sock")),
        ("8080:./app.sock", ForwardSpec("127.0.0.1", 8080, path="./app.sock")),
        ("8080:run/app.sock", ForwardSpec("127.0.0.1", 8080, path="run/app.sock")),
        ("127.0.0.2:0:/srv/a:b.sock", ForwardSpec("127.0.0.2", 0, path="/srv/a:b.sock")),
        ("[::1]:9000:/x/y.sock", ForwardSpec("::1", 9000, path="/x/y.sock")),
    ],
)
def test_good_specs(text: str, want: ForwardSpec) -> None:
    assert parse_spec(text) == want


def test_what_a_spec_says_to_the_hand_and_to_a_person() -> None:
    tcp = parse_spec("[::1]:8080:[::1]:80")
    assert tcp.args() == {"host": "::1", "port": 80}
    assert (tcp.target, tcp.listen) == ("[::1]:80", "[::1]:8080")
    unix = parse_spec("0:/run/app.sock")
    assert unix.args() == {"path": "/run/app.sock"}
    assert (unix.target, unix.listen) == ("/run/app.sock", "127.0.0.1:0")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty; expected [BIND:]PORT:HOST:HOSTPORT or [BIND:]PORT:/PATH"),
        ("8080", "missing HOST:HOSTPORT"),
        ("8080:db", "missing HOSTPORT"),
        ("8080:app.sock", "a Unix socket path must contain '/': ./name.sock"),
        ("70000:db:5432", "PORT 70000 is above 65535"),
        ("8080:db:70000", "HOSTPORT 70000 is above 65535"),
        ("8080:db:99999999999999999999", "HOSTPORT 99999999999999999999 is above 65535"),
        ("8080:db:0", "HOSTPORT 0 is not a port to connect to"),
        ("http:db:5432", "PORT 'http' is not a port number"),
        ("-1:db:5432", "PORT '-1' is not a port number"),
        ("8080:db:+5", "HOSTPORT '+5' is not a port number"),
        ("8080:db:٥", "HOSTPORT '٥' is not a port number"),
        (":db:5432", "empty PORT"),
        ("8080::5432", "empty HOST"),
        ("8080:db:", "empty HOSTPORT"),
        (":8080:db:5432", "empty BIND address (write '*' for every interface)"),
        ("8080:db host:5432", "HOST 'db host' is not a host name or an address"),
        ("8080:-db:5432", "HOST '-db' is not a host name or an address"),
        ("1.2.3.4:8080:db:5432:9", "too many parts"),
        ("8080:::1:80", "an IPv6 address goes in brackets"),
        ("8080:[::1:80", "'[' without its ']'"),
        ("8080:[::1]x:80", "expected ':' after [::1]"),
        ("8080:[db]:80", "HOST [db] is not an IPv6 address"),
        ("8080:[]:80", "HOST [] is not an IPv6 address"),
        ("8080:d]b:80", "brackets go around a whole IPv6 address"),
        ("[::1]:8080", "missing HOSTPORT"),
        ("1:2:3:/x.sock", "expected [BIND:]PORT:HOST:HOSTPORT"),
        ("/x.sock", "expected [BIND:]PORT:HOST:HOSTPORT"),
        ("70000:/x.sock", "PORT 70000 is above 65535"),
        ("8080:/x\x00.sock", "NUL"),
    ],
)
def test_bad_specs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_spec(text)
    assert message in str(info.value)
    assert str(info.value).startswith(f"bad forward {text!r}: ")


def test_a_spec_from_fields_is_checked_as_text_is() -> None:
    assert make_spec(host="127.0.0.1", port=5432) == ForwardSpec("127.0.0.1", 0, host="127.0.0.1", port=5432)
    assert make_spec(path="/run/a.sock", local_port=9000, bind="::1") == ForwardSpec("::1", 9000, path="/run/a.sock")
    assert make_spec("1:h:2") == ForwardSpec("127.0.0.1", 1, host="h", port=2)
    with pytest.raises(ValueError, match="HOSTPORT 70000 is above 65535"):
        make_spec(host="db", port=70000)
    with pytest.raises(ValueError, match="PORT '-1' is not a port number"):
        make_spec(host="db", port=1, local_port=-1)
    with pytest.raises(ValueError, match="give host and port, or path"):
        make_spec()
    with pytest.raises(ValueError, match="give both host and port"):
        make_spec(host="db")
    with pytest.raises(ValueError, match="not both"):
        make_spec("1:h:2", host="db")


# --- the command's usage errors -----------------------------------------------------------------


@pytest.fixture
def mind_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """`mind ARGS` in-process: (exit code, stdout, stderr). No Mind is ever reached: the URL is a
    closed port, and these commands must end before dialling it."""
    monkeypatch.setattr(exits, "JSON_ERRORS", False)  # `--json` sets it for the process
    monkeypatch.setenv("MINDHAND_URL", "ws://127.0.0.1:9")

    def run(*words: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            command(list(words))
        out, err = capsys.readouterr()
        return int(info.value.code or 0), out, err

    return run


def test_a_bad_spec_exits_2_before_anything_is_opened(mind_cli: Any) -> None:
    code, out, err = mind_cli("forward", "box", "-L", "0:db:5432", "-L", "70000:db:5432")
    assert code == 2
    assert err == "mind: forward: -L: bad forward '70000:db:5432': PORT 70000 is above 65535\n"
    assert out == ""


def test_no_spec_is_a_usage_error(mind_cli: Any) -> None:
    code, _, err = mind_cli("forward", "box")
    assert code == 2
    assert "give at least one -L [BIND:]PORT:HOST:HOSTPORT" in err


def test_a_bad_hand_name_is_a_usage_error(mind_cli: Any) -> None:
    code, _, err = mind_cli("forward", "no/such", "-L", "0:db:5432")
    assert code == 2
    assert "'no/such' is not a Hand name" in err


def test_json_usage_errors_are_json_too(mind_cli: Any) -> None:
    code, out, _ = mind_cli("forward", "box", "-L", "8080:db", "--json")
    assert code == 2
    got = json.loads(out)
    assert got["exit_code"] == 2 and "missing HOSTPORT" in got["error"]


def test_a_port_in_use_exits_2_naming_it(mind_cli: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = mind_cli("forward", "box", "-L", "0:db:1", "-L", f"{port}:127.0.0.1:5432")
    assert code == 2
    assert err == f"mind: forward: cannot listen on 127.0.0.1:{port}: address in use\n"
    assert out == ""


def test_a_bind_address_this_machine_lacks_exits_2(mind_cli: Any) -> None:
    code, _, err = mind_cli("forward", "box", "-L", "192.0.2.1:0:db:5432")
    assert code == 2
    assert "cannot listen on 192.0.2.1:0: this machine has no such address" in err


def test_the_command_is_listed_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        command(["forward", "--help"])
    out = capsys.readouterr().out
    assert "-L SPEC" in out and "[BIND:]PORT:HOST:HOSTPORT" in out and "--json" in out


def test_bind_listener_binds_but_does_not_listen() -> None:
    sock = bind_listener(parse_spec("0:db:1"))
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect((host, port))  # nothing accepted before the Hand's check
    finally:
        sock.close()


# --- the machinery, with a fake client --------------------------------------------------------------


def _end(state: RunState, **kw: Any) -> RunEnd:
    fields: dict[str, Any] = {"run_id": "r1", "hand": "box", "tool": "forward", "state": state, "reason": ""}
    fields |= {"error": None, "reject_code": None, "value": None} | kw
    return RunEnd.model_construct(**fields)


class FakeRun:
    """A `forward` run as `RunHandle` shows it: stdout echoes stdin (each chunk handed over and
    taken before the next is made, as the window allows), stdin's end ends stdout, then the end."""

    def __init__(self, stdin: AsyncIterator[bytes], *, fail: str | None = None, echo: bool = True) -> None:
        self.events_q: asyncio.Queue[Any] = asyncio.Queue()
        self.run_id = "r1"
        self.live = True
        self.cancels = 0
        self.made = 0
        self.offset = 0
        self.fail = fail
        self.task = asyncio.get_running_loop().create_task(self._drive(stdin, echo))

    async def _out(self, data: bytes, eof: bool = False) -> None:
        ev = StreamData.model_construct(run_id="r1", stream="stdout", offset=self.offset, data=data, eof=eof)
        self.offset += len(data)
        self.made += len(data)
        await self.events_q.put(ev)
        await self.events_q.join()  # taken: the consumer asked for the next

    async def _drive(self, stdin: AsyncIterator[bytes], echo: bool) -> None:
        if self.fail is not None:
            await self.events_q.put(_end(RunState.FAILED, error=self.fail, reason="tool_failed"))
            return
        n = 0
        async for chunk in stdin:
            n += len(chunk)
            if echo:
                await self._out(chunk)
        await self._out(b"", eof=True)
        await self.events_q.put(_end(RunState.SUCCEEDED, value={"sent": n, "received": n}))

    async def events(self) -> AsyncIterator[Any]:
        while True:
            ev = await self.events_q.get()
            if isinstance(ev, RunEnd):
                self.live = False
                yield ev
                return
            yield ev
            self.events_q.task_done()

    async def cancel(self) -> None:
        self.cancels += 1
        if self.live and not self.task.done():
            self.task.cancel()
            await self.events_q.put(_end(RunState.CANCELLED, reason="user_requested"))


class FakeClient:
    """What `LocalForward` asks of `MindClient`; its `check` answer and each run's behaviour set
    by the test."""

    connected = True
    resume_window = 0.0

    def __init__(self, check: RunEnd | None = None) -> None:
        self.check = check or _end(RunState.SUCCEEDED, value={"to": "127.0.0.1:5432", "addresses": ["127.0.0.1"]})
        self.runs: list[FakeRun] = []
        self.fail_next: list[str] = []
        self.checked: list[dict[str, Any]] = []
        self.started: list[dict[str, Any]] = []

    async def exec(self, hand: str, tool: str, args: dict[str, Any], **kw: Any) -> RunEnd:
        assert (hand, tool) == ("box", "forward")
        self.checked.append(args)
        return self.check

    async def start(self, hand: str, tool: str, args: dict[str, Any], **kw: Any) -> FakeRun:
        assert (hand, tool) == ("box", "forward") and kw["stream"] and kw["timeout"] == 86400
        self.started.append(args)
        run = FakeRun(kw["stdin"], fail=self.fail_next.pop(0) if self.fail_next else None)
        self.runs.append(run)
        return run


async def _echo(address: tuple[str, int], payload: bytes) -> bytes:
    """Send `payload`, half-close, read the answer to its EOF."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(payload)
    await writer.drain()
    writer.write_eof()
    got = await reader.read()
    writer.close()
    return got


async def test_bytes_go_both_ways_exactly_with_half_close() -> None:
    mc = FakeClient()
    closed: list[ForwardConnection] = []
    payload = bytes(range(256)) * 20000  # 5 MB
    async with open_forward(mc, "box", parse_spec("0:127.0.0.1:5432"), on_closed=closed.append) as fwd:
        assert mc.checked == [{"host": "127.0.0.1", "port": 5432, "check": True}]
        assert fwd.to == "127.0.0.1:5432" and fwd.address[0] == "127.0.0.1"
        assert fwd.describe() == {"listen": fwd.listen, "to": "127.0.0.1:5432", "hand": "box", "direction": "local"}
        got = await asyncio.wait_for(_echo(fwd.address, payload), 30)
        assert got == payload
        for _ in range(100):
            if closed:
                break
            await asyncio.sleep(0.02)
    assert mc.started == [{"host": "127.0.0.1", "port": 5432}]
    assert [(c.sent, c.received, c.error, c.run_id) for c in closed] == [(len(payload), len(payload), None, "r1")]


async def test_twenty_connections_at_once_each_exact() -> None:
    mc = FakeClient()
    async with open_forward(mc, "box", parse_spec("0:127.0.0.1:5432")) as fwd:
        payloads = [bytes([i]) * (10000 + i) for i in range(20)]
        got = await asyncio.wait_for(asyncio.gather(*(_echo(fwd.address, p) for p in payloads)), 30)
        assert got == payloads
        assert fwd.opened == 20 and fwd.failed == 0


async def test_a_refused_destination_resets_the_connection_says_one_line_and_the_forward_goes_on() -> None:
    mc = FakeClient()
    mc.fail_next = ["127.0.0.1:5433 refused the connection"]
    lines: list[str] = []
    async with open_forward(mc, "box", parse_spec("0:127.0.0.1:5433"), on_error=lines.append) as fwd:
        reader, writer = await asyncio.open_connection(*fwd.address)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 10)  # reset at once: no hang, no clean EOF
        writer.close()
        assert lines == ["box: 127.0.0.1:5433 refused the connection"]
        assert await asyncio.wait_for(_echo(fwd.address, b"again"), 10) == b"again"
        assert fwd.failed == 1 and fwd.opened == 2


async def test_a_refused_check_raises_before_anything_listens() -> None:
    refused = _end(
        RunState.REJECTED,
        error="10.0.0.9:5432 is not a destination this hand allows",
        reject_code=RejectCode.DENIED_BY_POLICY,
        reason="denied_by_policy",
    )
    mc = FakeClient(check=refused)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ForwardError) as info:
        async with open_forward(mc, "box", parse_spec(f"{port}:10.0.0.9:5432")):
            pytest.fail("entered")
    assert info.value.code == ClientCode.REJECTED
    assert info.value.message == (
        "cannot forward to box:10.0.0.9:5432: 10.0.0.9:5432 is not a destination this hand allows (denied_by_policy)"
    )
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))
    assert mc.started == []


async def test_a_slow_local_reader_holds_the_run_back() -> None:
    """The next chunk is taken only once the local socket took this one: with nobody reading, what
    the run made stops near the socket buffers, and every byte still arrives, in order."""
    mc = FakeClient()
    total = 64 << 20
    chunk = 256 << 10

    async def feed() -> AsyncIterator[bytes]:
        block = bytes(range(256)) * (chunk // 256)
        for _ in range(total // chunk):
            yield block

    class Producing(FakeRun):
        def __init__(self, stdin: AsyncIterator[bytes], **kw: Any) -> None:
            super().__init__(feed(), **kw)

    async def start(hand: str, tool: str, args: dict[str, Any], **kw: Any) -> FakeRun:
        run: FakeRun = Producing(kw["stdin"])
        mc.runs.append(run)
        return run

    mc.start = start  # type: ignore[method-assign]
    async with open_forward(mc, "box", parse_spec("0:127.0.0.1:5432")) as fwd:
        loop = asyncio.get_running_loop()
        with socket.create_connection(fwd.address) as s:
            s.setblocking(False)
            await asyncio.sleep(0.5)  # nobody reads
            held = mc.runs[0].made
            assert held < 24 << 20, f"{held} bytes made with nobody reading"
            got = 0
            block = bytes(range(256)) * (chunk // 256)
            buf = b""
            while data := await asyncio.wait_for(loop.sock_recv(s, 1 << 20), 30):
                buf += data
                while len(buf) >= chunk:
                    assert buf[:chunk] == block
                    buf = buf[chunk:]
                    got += chunk
            assert got == total and buf == b""


async def test_a_local_reset_cancels_the_run() -> None:
    mc = FakeClient()
    async with open_forward(mc, "box", parse_spec("0:127.0.0.1:5432")) as fwd:
        s = socket.create_connection(fwd.address)
        s.sendall(b"hello")
        for _ in range(200):
            if mc.runs and mc.runs[0].made:
                break
            await asyncio.sleep(0.01)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        for _ in range(200):
            if not mc.runs[0].live:
                break
            await asyncio.sleep(0.01)
        assert mc.runs[0].cancels == 1 and not mc.runs[0].live
        assert fwd.failed == 0  # ended by our side: nothing to report


async def test_closing_the_forward_cancels_open_connections_and_stops_listening() -> None:
    mc = FakeClient()
    fwd = LocalForward(mc, "box", parse_spec("0:127.0.0.1:5432"))
    await fwd.check()
    await fwd.start()
    reader, writer = await asyncio.open_connection(*fwd.address)
    writer.write(b"open")
    assert await asyncio.wait_for(reader.readexactly(4), 10) == b"open"
    assert fwd.active == 1
    await asyncio.wait_for(fwd.close(), 10)
    assert mc.runs[0].cancels == 1 and fwd.active == 0
    with pytest.raises(ConnectionResetError):  # its run was cancelled, not ended: reset, not EOF
        await asyncio.wait_for(reader.read(), 10)
    writer.close()
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(fwd.address)


async def test_a_broken_callback_never_takes_the_listener_down() -> None:
    mc = FakeClient()
    mc.fail_next = ["connection reset by 127.0.0.1:5432"]

    def broken(line: str) -> None:
        raise RuntimeError("bug in the caller")

    async with open_forward(mc, "box", parse_spec("0:127.0.0.1:5432"), on_error=broken) as fwd:
        _, writer = await asyncio.open_connection(*fwd.address)
        for _ in range(200):
            if fwd.failed:
                break
            await asyncio.sleep(0.01)
        writer.close()
        assert await asyncio.wait_for(_echo(fwd.address, b"still here"), 10) == b"still here"

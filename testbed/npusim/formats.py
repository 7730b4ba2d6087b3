"""Text the simulated `npu-smi` and `hccn_tool` print, as pure functions.

The layouts copy what the real tools print on an Atlas 800 A3 node (16 logical
NPUs = 8 boards x 2 dies). Sources, all public:

* `npu-smi info` A3 table: the environment dumps attached to vllm-project/vllm-ascend
  GitHub issues (npu-smi 24.1.rc3 .. 25.3.rc1, "Chip  Phy-ID" header, 98 columns),
  and the print_total_info_header_v1() code of the npu-smi source published by Huawei.
* `npu-smi info -t spod-info -i N -c C` ("SDID", "Super Pod Size", "Super Pod ID",
  "Server Index"): Ascend memfabric_hybrid docs and the vllm-ascend ranktable scripts.
* `npu-smi info -m` columns (NPU ID, Chip ID, Chip Logic ID, Chip Phy-ID, Chip Name,
  a "Mcu" row per board): vllm-ascend tests/ut for cpu_binding.
* `hccn_tool` outputs (`link status: UP`, `net health status: Success`,
  `netdetect addr: X` (driver source; older guides `netdetect address: X`), `Speed: 100000 Mb/s`
  (the example in Huawei's Ascend/mind-cluster hccn_tool.go),
  `default gateway:X, Iface:ethN`, `ipaddr:X` / `netmask:X`,
  `dev_id:N, tls switch[0](0:disable, 1:enable), ...`, the `-ping` lines):
  the vllm-ascend "Verify Multi-Node Communication" guide and the MindIE
  multi-node deployment docs that show each command's sample output.
* `-vnic -g` and `-hccs_ping -g` lines: the hccn_tool source published under the
  CANN Open Software License (tool_ping_printf(), vnic getters).
* `-lldp -g`: lldptool-style TLV blocks with a tab-indented `Ifname:` line, as the
  `hccn_tool -i $i -lldp -g | grep Ifname` examples show.
* `/etc/hccn.conf`: `address_N=`, `netmask_N=`, `netdetect_N=`, `gateway_N=` (HCCL ranktable docs).

Exact wording of error messages for a missing device was not found in public
sources; those below are clearly-worded approximations.
"""

from __future__ import annotations

from .model import CHIPS_PER_NPU, NPUS_PER_HOST, BedMap, Faults, HostEntry, Npu

WIDTH = 96  # inner width of the npu-smi table
SEP_TOP = "+" + "-" * WIDTH + "+"
SEP_COLS = "+---------------------------+---------------+----------------------------------------------------+"
SEP_BOARD = "+===========================+===============+====================================================+"
BUS_IDS = (
    "9D", "9F", "99", "9B", "95", "97", "91", "93",
    "8D", "8F", "89", "8B", "85", "87", "81", "83",
)  # fmt: skip


def _boxed(text: str) -> str:
    return "| " + text.ljust(WIDTH - 1) + "|"


def _temp(npu: int) -> int:
    return 35 + (npu * 7) % 5


def _hbm_used(npu: int) -> int:
    return 3100 + (npu * 37) % 350


def by_board(faults: Faults) -> dict[int, list[int]]:
    """Logical NPU ids the node still shows, by board (boards and ids in order)."""
    boards: dict[int, list[int]] = {}
    for i in range(NPUS_PER_HOST):
        if i not in faults.missing_npus:
            boards.setdefault(i // CHIPS_PER_NPU, []).append(i)
    return boards


def npu_smi_info(bed: BedMap, host: HostEntry, faults: Faults) -> str:
    """`npu-smi info` as on an Atlas 800 A3 node."""
    ver = bed.driver_version
    lines = [
        SEP_TOP,
        _boxed(f"npu-smi {ver:<25}Version: {ver}"),
        SEP_COLS,
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
        "| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
        SEP_BOARD,
    ]
    boards = by_board(faults)
    for board, chips in boards.items():
        for n, npu in enumerate(chips):
            chip = npu % CHIPS_PER_NPU
            power = f"{170.0 + (npu * 13) % 20:.1f}" if chip == 0 else "-"
            health = faults.health.get(npu, "OK")
            lines.append(f"| {board:<6}{'Ascend910':<20}| {health:<14}| {power:<12}{_temp(npu):<18}{0:<5}/ {0:<14}|")
            bus = f"0000:{BUS_IDS[npu]}:00.0"
            lines.append(f"| {chip:<6}{npu:<20}| {bus:<14}| {0:<12}{0:<5}/ {0:<11}{_hbm_used(npu):<5}/ {65536:<14}|")
            lines.append(SEP_BOARD if n == len(chips) - 1 else SEP_TOP)
    lines += [
        SEP_COLS,
        "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |",
        SEP_BOARD,
    ]
    for board in boards:
        lines += [_boxed(f"No running processes found in NPU {board}"), SEP_BOARD]
    return "\n".join(lines) + "\n"


def _kv(key: str, value: object) -> str:
    return f"\t{key:<31}: {value}"


def npu_smi_list(faults: Faults) -> str:
    """`npu-smi info -l`: board count, then each board's chip count."""
    boards = by_board(faults)
    lines = [_kv("Total Count", len(boards)), ""]
    for board, chips in boards.items():
        lines += [
            _kv("NPU ID", board),
            _kv("Product Name", "Atlas 800 A3"),
            _kv("Serial Number", f"K3TB{board:04d}"),
            _kv("Chip Count", len(chips)),
            "",
        ]
    return "\n".join(lines)


def npu_smi_map(faults: Faults) -> str:
    """`npu-smi info -m`: board, die, logical id, physical id, name (+ one Mcu row per board)."""
    head = ("NPU ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID", "Chip Name")
    lines = ["\t" + "".join(f"{h:<31}" for h in head[:-1]) + head[-1]]
    for board, chips in by_board(faults).items():
        for npu in chips:
            cells = (board, npu % CHIPS_PER_NPU, npu, npu)
            lines.append("\t" + "".join(f"{c:<31}" for c in cells) + "Ascend910")
        lines.append("\t" + "".join(f"{c:<31}" for c in (board, CHIPS_PER_NPU, "-", "-")) + "Mcu")
    return "\n".join(lines) + "\n"


def sdid(host: HostEntry, npu: int) -> int:
    """Super-device id: server index in bits 22+, as in the documented sample (index 4 -> 16777216)."""
    return (host.index << 22) | (npu << 16)


def npu_smi_spod_info(bed: BedMap, host: HostEntry, npu: int) -> str:
    """`npu-smi info -t spod-info -i CARD -c CHIP`."""
    lines = [
        _kv("SDID", sdid(host, npu)),
        _kv("Super Pod Size", bed.super_pod_size),
        _kv("Super Pod ID", bed.super_pod_id),
        _kv("Server Index", host.index),
    ]
    return "\n".join(lines) + "\n"


def npu_smi_board(bed: BedMap, npu: int) -> str:
    """`npu-smi info -t board -i CARD [-c CHIP]`: versions used by preflight."""
    lines = [
        _kv("NPU ID", npu // CHIPS_PER_NPU),
        _kv("Software Version", bed.driver_version),
        _kv("Firmware Version", bed.firmware_version),
        _kv("Compatibility", "OK"),
        _kv("Board ID", "0xb0"),
        _kv("PCB ID", "A"),
        _kv("BOM ID", "1"),
        _kv("PCIe Bus Info", f"0000:{BUS_IDS[npu]}:00.0"),
        _kv("Slot ID", npu // CHIPS_PER_NPU),
        _kv("Chip Name", "Ascend910"),
    ]
    return "\n".join(lines) + "\n"


def hccn_link(faults: Faults, npu: int) -> str:
    return f"link status: {'DOWN' if npu in faults.link_down else 'UP'}\n"


def hccn_speed() -> str:
    """`-speed -g`: Huawei's own example (Ascend/mind-cluster component/ascend-common/devmanager/hccn)."""
    return "Speed: 100000 Mb/s\n"


def hccn_net_health(faults: Faults, npu: int) -> str:
    return f"net health status: {faults.net_health.get(npu, 'Success')}\n"


def hccn_netdetect(n: Npu) -> str:
    return f"netdetect addr: {n.gateway}\n"  # the driver source's form (docs/SOURCES.md); guides show "address:"


def hccn_gateway(n: Npu) -> str:
    return f"default gateway:{n.gateway}, Iface:eth{n.id}\n"


def hccn_ip(n: Npu) -> str:
    return f"ipaddr:{n.ip}\nnetmask:{n.netmask}\n"


def hccn_vnic(n: Npu) -> str:
    return f"vnic link status: UP\nvnic ipaddr: {n.vnic_ip}\nvnic netmask: {n.netmask}\n"


def hccn_tls(faults: Faults, npu: int) -> str:
    switch = faults.tls_for(npu)
    return (
        f"dev_id:{npu}, tls switch[{switch}](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), "
        "tls alarm time threshold[60]days\n"
        f"dev_id:{npu}, [pub cert] info:\n"
        "         issuer[/C=CN/ST=GD/O=HUAWEI/OU=2012/CN=2_1thCA]\n"
        "         start_time[Wed Feb 19 03:19:21 2020 GMT]\n"
        "         end_time[Sat Feb 16 03:19:21 2030 GMT]\n"
    )


def hccn_lldp(host: HostEntry, n: Npu) -> str:
    """`-lldp -g`: the switch port facing this NPU (unique per host and NPU)."""
    port = f"400GE1/{host.index + 1}/{n.card + 1}:{n.chip + 1}"
    mac = f"f4:1d:6b:{host.index:02x}:{n.card:02x}:{n.chip:02x}"
    return (
        "Chassis ID TLV\n"
        f"\tMAC: {mac}\n"
        "Port ID TLV\n"
        f"\tIfname: {port}\n"
        "Time to Live TLV\n"
        "\t121\n"
        "Port Description TLV\n"
        f"\tto-{host.name}-npu{n.id}\n"
        "System Name TLV\n"
        "\tK3TB-LEAF-01\n"
        "System Description TLV\n"
        "\tHuawei Versatile Routing Platform Software (k3deploy test bed)\n"
        "System Capabilities TLV\n"
        "\tSystem capabilities:  Bridge, Router\n"
        "\tEnabled capabilities: Bridge, Router\n"
        "Maximum Frame Size TLV\n"
        "\t9216\n"
        "End of LLDPDU TLV\n"
    )


def received(count: int, loss: float) -> int:
    """Packets that come back when a share `loss` is dropped (rounded, deterministic)."""
    return count - round(count * loss)


def hccn_ping(npu: int, address: str, count: int, got: int) -> str:
    """`-ping -g address IP` (RoCE plane): per-reply lines, then a summary."""
    lines = [f"device {npu} PING {address}"]
    lines += [f"recv seq={seq},time={0.06 + 0.01 * (seq % 5):.6f}ms" for seq in range(got)]
    loss = 100.0 * (count - got) / count if count else 0.0
    lines.append(f"{count} packets transmitted, {got} received, {loss:.2f}% packet loss")
    return "\n".join(lines) + "\n"


def hccn_hccs_ping(npu: int, address: str, count: int, got: int) -> str:
    """`-hccs_ping -g address IP` (HCCS plane), following tool_ping_printf()."""
    lines = [f"device {npu} PING {address}", ""]
    times = []
    for seq in range(count):
        ok = seq < got
        t_ns = 11000 + 250 * (seq % 4) if ok else 0
        if ok:
            times.append(t_ns)
        lines.append("This pkt ping success!" if ok else "This pkt check recv msg fail!")
        lines += [f"recv seq {seq}, time = {t_ns // 1000}.{t_ns % 1000:03d}us, L1 plane check result = 0x0", ""]
    loss = 100.0 * (count - got) / count if count else 0.0

    def us(ns: int) -> str:
        return f"{ns // 1000}.{ns % 1000:03d}us"

    avg = sum(times) // len(times) if times else 0
    tp95 = sorted(times)[int(0.95 * len(times))] if times else 0
    lines += [
        f"{count} packets transmitted, {got} received, {loss:.2f}% packets loss",
        f"max time {us(max(times, default=0))}",
        f"min time {us(min(times, default=0))}",
        f"average time {us(avg)}",
        f"TP95 time {us(tp95)}",
    ]
    return "\n".join(lines) + "\n"


def hccn_conf(host: HostEntry) -> str:
    """/etc/hccn.conf for a host: one block of keys per NPU."""
    out = []
    for n in host.npus:
        out += [
            f"address_{n.id}={n.ip}",
            f"netmask_{n.id}={n.netmask}",
            f"netdetect_{n.id}={n.gateway}",
            f"gateway_{n.id}={n.gateway}",
            f"send_arp_status_{n.id}=1",
        ]
    return "\n".join(out) + "\n"

#!/usr/bin/env python3
"""Generate RoCEv2 test vectors with scapy, an implementation independent of this project.

Run with Debian's python3 and python3-scapy:
    /usr/bin/python3 tests/scapy/gen_vectors.py > tests/data/rocev2_vectors.json

scapy's contrib/roce.py builds Ethernet/IP/UDP/BTH and computes the RoCEv2 ICRC for IPv4 (it has no IPv6
ICRC). The extended transport headers that scapy lacks (RETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH)
are written here from the IBTA layouts with struct.pack, independently of the Rust code. For IPv6 the ICRC is
computed here with zlib.crc32 over the masked pseudo-packet (IBTA Annex A17.3.3): traffic class, flow label
and hop limit, UDP checksum and the BTH FECN/BECN/reserved byte set to ones, 8 bytes of 0xFF in front.
The output is fixed test data: it is committed and read by tests/tests/scapy_vectors.rs.
"""
import json
import struct
import zlib

from scapy.all import Ether, IP, IPv6, UDP, Raw, raw, load_contrib

load_contrib("roce")
from scapy.contrib.roce import BTH  # noqa: E402

RC, UC, UD = 0x00, 0x20, 0x60
# base op -> (name, ext headers in wire order, carries payload)
OPS = {
    0x00: ("SEND_FIRST", [], True),
    0x01: ("SEND_MIDDLE", [], True),
    0x02: ("SEND_LAST", [], True),
    0x03: ("SEND_LAST_WITH_IMMEDIATE", ["immdt"], True),
    0x04: ("SEND_ONLY", [], True),
    0x05: ("SEND_ONLY_WITH_IMMEDIATE", ["immdt"], True),
    0x06: ("RDMA_WRITE_FIRST", ["reth"], True),
    0x07: ("RDMA_WRITE_MIDDLE", [], True),
    0x08: ("RDMA_WRITE_LAST", [], True),
    0x09: ("RDMA_WRITE_LAST_WITH_IMMEDIATE", ["immdt"], True),
    0x0A: ("RDMA_WRITE_ONLY", ["reth"], True),
    0x0B: ("RDMA_WRITE_ONLY_WITH_IMMEDIATE", ["reth", "immdt"], True),
    0x0C: ("RDMA_READ_REQUEST", ["reth"], False),
    0x0D: ("RDMA_READ_RESPONSE_FIRST", ["aeth"], True),
    0x0E: ("RDMA_READ_RESPONSE_MIDDLE", [], True),
    0x0F: ("RDMA_READ_RESPONSE_LAST", ["aeth"], True),
    0x10: ("RDMA_READ_RESPONSE_ONLY", ["aeth"], True),
    0x11: ("ACKNOWLEDGE", ["aeth"], False),
    0x12: ("ATOMIC_ACKNOWLEDGE", ["aeth", "atomic_ack_eth"], False),
    0x13: ("COMPARE_SWAP", ["atomic_eth"], False),
    0x14: ("FETCH_ADD", ["atomic_eth"], False),
    0x16: ("SEND_LAST_WITH_INVALIDATE", ["ieth"], True),
    0x17: ("SEND_ONLY_WITH_INVALIDATE", ["ieth"], True),
}
UC_OPS = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B]
UD_OPS = {0x04: ("SEND_ONLY", ["deth"], True), 0x05: ("SEND_ONLY_WITH_IMMEDIATE", ["deth", "immdt"], True)}

EXT_VALUES = {
    "reth": {"va": 0x00007F12_3456_7000, "rkey": 0x0001_2A05, "dma_len": 4096},
    "aeth": {"syndrome": 0x1F, "msn": 0x00ABCDEF},
    "atomic_eth": {"va": 0x0000_5555_0000_1008, "rkey": 0x0000_0317, "swap_add": 0x0102_0304_0506_0708,
                   "compare": 0x1112_1314_1516_1718},
    "atomic_ack_eth": {"orig": 0xDEAD_BEEF_CAFE_F00D},
    "immdt": {"imm": 0x1234_5678},
    "ieth": {"rkey": 0x0000_4C21},
    "deth": {"qkey": 0x1111_1111, "src_qp": 0x000011},
}


def ext_bytes(name):
    v = EXT_VALUES[name]
    if name == "reth":
        return struct.pack("!QII", v["va"], v["rkey"], v["dma_len"])
    if name == "aeth":
        return struct.pack("!I", (v["syndrome"] << 24) | v["msn"])
    if name == "atomic_eth":
        return struct.pack("!QIQQ", v["va"], v["rkey"], v["swap_add"], v["compare"])
    if name == "atomic_ack_eth":
        return struct.pack("!Q", v["orig"])
    if name == "immdt":
        return struct.pack("!I", v["imm"])
    if name == "ieth":
        return struct.pack("!I", v["rkey"])
    if name == "deth":
        return struct.pack("!II", v["qkey"], v["src_qp"])
    raise KeyError(name)


def icrc_v6(frame):
    """IPv6 ICRC, computed here because scapy's roce contrib has none (IBTA Annex A17.3.3)."""
    ip = bytearray(frame[14:-4])
    ip[0] |= 0x0F  # traffic class (high nibble in byte 0 low nibble, rest in byte 1)
    ip[1] = 0xFF  # traffic class low nibble + flow label high nibble
    ip[2] = 0xFF
    ip[3] = 0xFF  # flow label
    ip[7] = 0xFF  # hop limit
    ip[40 + 6] = 0xFF
    ip[40 + 7] = 0xFF  # UDP checksum
    ip[48 + 4] = 0xFF  # BTH FECN/BECN/resv6
    return zlib.crc32(b"\xff" * 8 + bytes(ip)) & 0xFFFFFFFF


def vector(name, transport, op_code, op_info, ipver, payload, pad, dqpn, psn, se=0, migreq=1, ackreq=0,
           udp_csum=None, tos=0x02, vlan=None):
    op_name, exts, has_payload = op_info
    opcode = transport | op_code
    body = b"".join(ext_bytes(e) for e in exts)
    if not has_payload:
        payload, pad = b"", 0
    bth = BTH(opcode=opcode, solicited=se, migreq=migreq, padcount=pad, pkey=0xFFFF, dqpn=dqpn,
              ackreq=ackreq, psn=psn)
    ether = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    if ipver == 4:
        ip = IP(src="192.168.0.7", dst="192.168.0.8", tos=tos, id=1144, flags="DF", ttl=64)
    else:
        ip = IPv6(src="fe80::ff:fe00:1", dst="fe80::ff:fe00:2", tc=tos, fl=0x12345, hlim=64)
    udp = UDP(sport=0xC000 + (dqpn & 0x3FFF), dport=4791)
    if udp_csum is not None:
        udp.chksum = udp_csum
    pkt = ether / ip / udp / bth / Raw(body + payload + b"\x00" * pad)
    frame = bytearray(raw(pkt))
    if ipver == 6:
        # scapy wrote ICRC 0 for IPv6; put the real one in, then let scapy recompute the UDP checksum
        # over the final bytes when one is wanted.
        icrc = icrc_v6(bytes(frame))
        frame[-4:] = struct.pack("<I", icrc)
        if udp_csum is None:
            p = Ether(bytes(frame))
            del p[UDP].chksum
            frame = bytearray(raw(p))
    else:
        icrc = struct.unpack("<I", bytes(frame[-4:]))[0]  # CRC-32 value; little-endian on the wire
    p = Ether(bytes(frame))
    return {
        "name": name,
        "transport": {RC: "RC", UC: "UC", UD: "UD"}.get(transport, "CNP"),
        "opcode": opcode,
        "op": op_name,
        "ip_version": ipver,
        "ip_ident": 1144 if ipver == 4 else 0,
        "tos": tos,
        "udp_src_port": p[UDP].sport,
        "udp_checksum": p[UDP].chksum,
        "ip_checksum": p[IP].chksum if ipver == 4 else 0,
        "solicited": se,
        "mig_req": migreq,
        "pad_cnt": pad,
        "pkey": 0xFFFF,
        "dest_qpn": dqpn,
        "ack_req": ackreq,
        "psn": psn,
        "ext": {e: EXT_VALUES[e] for e in exts},
        "payload": payload.hex(),
        "icrc_wire": struct.pack("<I", icrc).hex(),
        "frame": bytes(frame).hex(),
    }


def main():
    out = []
    # The scapy contrib's own test vector (its test suite, and the acceptance check).
    pkt = (Ether(src="00:11:22:33:44:55", dst="66:77:88:99:aa:bb")
           / IP(src="192.168.0.7", dst="192.168.0.7", tos=1, id=1144, flags="DF", ttl=64)
           / UDP(sport=49152, dport=4791)
           / BTH(opcode=0x24, migreq=1, padcount=2, pkey=0xFFFF, dqpn=211, psn=13571856)
           / Raw(bytes.fromhex("4630818be28935d90e9a95505401be885e500000")))
    frame = raw(pkt)
    p = Ether(frame)
    out.append({"name": "scapy_uc_send_only_reference", "transport": "UC", "opcode": 0x24,
                "op": "SEND_ONLY", "ip_version": 4, "ip_ident": 1144, "tos": 1, "udp_src_port": 49152,
                "udp_checksum": p[UDP].chksum, "ip_checksum": p[IP].chksum, "solicited": 0, "mig_req": 1,
                "pad_cnt": 2, "pkey": 0xFFFF, "dest_qpn": 211, "ack_req": 0, "psn": 13571856, "ext": {},
                "payload": "4630818be28935d90e9a95505401be885e50", "icrc_wire": frame[-4:].hex(),
                "frame": frame.hex()})
    payload_odd = bytes((i * 37 + 11) & 0xFF for i in range(61))  # 61 bytes -> PadCnt 3
    payload_even = bytes((i * 13 + 5) & 0xFF for i in range(64))
    for ipver in (4, 6):
        for op, info in OPS.items():
            pl, pad = (payload_odd, 3) if op % 2 else (payload_even, 0)
            out.append(vector(f"rc_{info[0].lower()}_ipv{ipver}", RC, op, info, ipver, pl, pad,
                              dqpn=0x000100 + op, psn=(0xFFFFF0 + op) & 0xFFFFFF, ackreq=int(op % 3 == 0), se=int(op == 0x05)))
        for op in UC_OPS:
            info = OPS[op]
            out.append(vector(f"uc_{info[0].lower()}_ipv{ipver}", UC, op, info, ipver, payload_even, 0,
                              dqpn=0x00ABC0 + op, psn=op))
        for op, info in UD_OPS.items():
            out.append(vector(f"ud_{info[0].lower()}_ipv{ipver}", UD, op, info, ipver, payload_odd, 3,
                              dqpn=0xFFFFFF - op, psn=0x7FFFFF))
    # IPv6 with a zero UDP checksum, as Linux rxe sends it.
    out.append(vector("rc_send_only_ipv6_zero_udp_checksum", RC, 0x04, OPS[0x04], 6, payload_even, 0,
                      dqpn=0x12, psn=0x34, udp_csum=0))
    # RoCEv2 CNP (Annex A17.9.3): BTH opcode 0x81 + 16 reserved bytes, here with BECN set as scapy's cnp().
    cnp = (Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
           / IP(src="192.168.0.7", dst="192.168.0.8", tos=0x02, id=1144, flags="DF", ttl=64)
           / UDP(sport=0xC000, dport=4791)
           / BTH(opcode=0x81, becn=1, pkey=0xFFFF, dqpn=0x000123, psn=0) / Raw(b"\x00" * 16))
    frame = raw(cnp)
    p = Ether(frame)
    out.append({"name": "cnp_ipv4", "transport": "CNP", "opcode": 0x81, "op": "CNP", "ip_version": 4,
                "ip_ident": 1144, "tos": 2, "udp_src_port": 0xC000, "udp_checksum": p[UDP].chksum,
                "ip_checksum": p[IP].chksum, "solicited": 0, "mig_req": 0, "pad_cnt": 0, "pkey": 0xFFFF,
                "dest_qpn": 0x123, "ack_req": 0, "psn": 0, "becn": 1, "ext": {}, "payload": "00" * 16,
                "icrc_wire": frame[-4:].hex(), "frame": frame.hex()})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the sysfs files a kernel rxe device shows, for the devices the drop-in libibverbs lists.

Usage: sysfs_ib.py OUT_DIR

Run with LD_LIBRARY_PATH pointing at the drop-in libibverbs.so.1 (and ROCE_DEVICES if set): it runs
`ibv_devinfo -v` and writes, under OUT_DIR, two trees that tests/sysfs-ib.sh mounts in a private
mount namespace:

  OUT_DIR/infiniband/NAME/                 what /sys/class/infiniband/NAME shows for rxe
      node_type ("1: CA"), node_guid, sys_image_guid, fw_ver, node_desc
      device/net/IFNAME -> /sys/class/net/IFNAME   the interface holding the device's address
      device/numa_node ("-1")
      ports/1/{state,phys_state,link_layer,lid,sm_lid,lid_mask_count,sm_sl,cap_mask,rate}
      ports/1/gids/N, ports/1/gid_attrs/types/N ("RoCE v2"), ports/1/gid_attrs/ndevs/N (IFNAME)
      ports/1/pkeys/0 ("0xffff")
  OUT_DIR/infiniband_verbs/uverbsI/{ibdev,abi_version,dev}, OUT_DIR/infiniband_verbs/abi_version
  OUT_DIR/uverbs.list                      "uverbsI" lines: the /dev/infiniband nodes to create

Formats as the kernel's drivers/infiniband/core/sysfs.c prints them (state "4: ACTIVE",
phys_state "5: LinkUp", GIDs as eight groups of four hex digits, gid_attrs/types as
"RoCE v2"). Only the GID entries the library reports are written (the kernel shows every
entry of the table, unused ones as zeros). This emulates the kernel's view for programs that read
it (pyverbs' rdmacm tests: device/net; UCX: gid_attrs, numa_node); the library itself never reads
sysfs.
"""

import ipaddress
import json
import os
import re
import subprocess
import sys

STATES = {"PORT_DOWN": "1: DOWN", "PORT_INIT": "2: INIT", "PORT_ARMED": "3: ARMED",
          "PORT_ACTIVE": "4: ACTIVE", "PORT_ACTIVE_DEFER": "5: ACTIVE_DEFER"}
PHYS = {"SLEEP": "1: Sleep", "POLLING": "2: Polling", "DISABLED": "3: Disabled",
        "PORT_CONFIGURATION TRAINNING": "4: PortConfigurationTraining", "LINK_UP": "5: LinkUp",
        "LINK_ERROR_RECOVERY": "6: LinkErrorRecovery", "PHY TEST": "7: Phy Test"}


def parse_devinfo(text):
    """ibv_devinfo -v output -> [{name, fields, ports: {N: {fields, gids: [(idx, gid, type)]}}}]."""
    devices = []
    dev = port = None
    for line in text.splitlines():
        m = re.match(r"^hca_id:\s+(\S+)", line)
        if m:
            dev = {"name": m.group(1), "fields": {}, "ports": {}}
            devices.append(dev)
            port = None
            continue
        if dev is None:
            continue
        m = re.match(r"^\s+port:\s+(\d+)", line)
        if m:
            port = {"fields": {}, "gids": []}
            dev["ports"][int(m.group(1))] = port
            continue
        m = re.match(r"^\s+GID\[\s*(\d+)\]:\s+([^,\s]+)(?:,\s*(.*))?$", line)
        if m and port is not None:
            port["gids"].append((int(m.group(1)), m.group(2), (m.group(3) or "").strip()))
            continue
        m = re.match(r"^\s+(\w+):\s+(.*)$", line)
        if m:
            (port["fields"] if port is not None else dev["fields"])[m.group(1)] = m.group(2).strip()
    return devices


def interfaces():
    """[(ifname, ip_interface)] from `ip -j addr`."""
    out = subprocess.run(["ip", "-j", "addr"], check=True, capture_output=True, text=True).stdout
    result = []
    for link in json.loads(out):
        for a in link.get("addr_info", []):
            result.append((link["ifname"],
                           ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}")))
    return result


def netdev_of(gid, ifaces):
    """The interface holding the GID's address: exact match first, then the one whose prefix
    holds it (127.0.0.0/8 on lo holds every 127.x.y.z a device may use)."""
    addr = ipaddress.IPv6Address(gid)
    addr = addr.ipv4_mapped or addr
    for name, iface in ifaces:
        if iface.ip == addr:
            return name
    for name, iface in ifaces:
        if iface.ip.version == addr.version and addr in iface.network:
            return name
    return None


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def guid(value):
    # ibv_devinfo prints "0200:00ff:fe00:0051"; sysfs prints the same four groups.
    return value


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: sysfs_ib.py OUT_DIR")
    out_dir = sys.argv[1]
    run = subprocess.run(["ibv_devinfo", "-v"], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        sys.exit(f"sysfs_ib: ibv_devinfo -v failed ({run.returncode}): {run.stderr.strip()}")
    devices = parse_devinfo(run.stdout)
    if not devices:
        sys.exit("sysfs_ib: ibv_devinfo -v lists no device (is LD_LIBRARY_PATH the drop-in library?)")
    ifaces = interfaces()
    verbs = []
    for index, dev in enumerate(devices):
        base = os.path.join(out_dir, "infiniband", dev["name"])
        f = dev["fields"]
        write(f"{base}/node_type", "1: CA")
        write(f"{base}/node_guid", guid(f.get("node_guid", "0000:0000:0000:0000")))
        write(f"{base}/sys_image_guid", guid(f.get("sys_image_guid", "0000:0000:0000:0000")))
        write(f"{base}/fw_ver", f.get("fw_ver", "0.0.0"))
        write(f"{base}/node_desc", f"{dev['name']} soft-hca")
        write(f"{base}/device/numa_node", "-1")
        netdevs = set()
        for num, port in dev["ports"].items():
            p = f"{base}/ports/{num}"
            pf = port["fields"]
            state = pf.get("state", "").split()[0] if pf.get("state") else "PORT_DOWN"
            write(f"{p}/state", STATES.get(state, "1: DOWN"))
            phys = re.sub(r"\s*\(\d+\)$", "", pf.get("phys_state", "DISABLED"))
            write(f"{p}/phys_state", PHYS.get(phys, "3: Disabled"))
            write(f"{p}/link_layer", pf.get("link_layer", "Ethernet"))
            write(f"{p}/lid", "0x" + format(int(pf.get("port_lid", "0"), 0), "x"))
            write(f"{p}/sm_lid", "0x" + format(int(pf.get("sm_lid", "0"), 0), "x"))
            write(f"{p}/lid_mask_count", str(int(pf.get("port_lmc", "0"), 0)))
            write(f"{p}/sm_sl", pf.get("sm_sl", "0"))
            write(f"{p}/cap_mask", pf.get("port_cap_flags", "0x00000000"))
            write(f"{p}/pkeys/0", "0xffff")
            speed = re.match(r"([\d.]+) Gbps", pf.get("active_speed", ""))
            width = re.match(r"(\d+)X", pf.get("active_width", ""))
            if speed and width:
                gbps = float(speed.group(1)) * int(width.group(1))
                write(f"{p}/rate", f"{gbps:g} Gb/sec ({width.group(1)}X)")
            for idx, gid, gtype in port["gids"]:
                write(f"{p}/gids/{idx}", ipaddress.IPv6Address(gid).exploded)
                write(f"{p}/gid_attrs/types/{idx}",
                      "RoCE v2" if gtype == "RoCE v2" else "IB/RoCE v1")
                ndev = netdev_of(gid, ifaces)
                if ndev:
                    write(f"{p}/gid_attrs/ndevs/{idx}", ndev)
                    netdevs.add(ndev)
        os.makedirs(f"{base}/device/net", exist_ok=True)
        for ndev in sorted(netdevs):
            os.symlink(f"/sys/class/net/{ndev}", f"{base}/device/net/{ndev}")
        v = os.path.join(out_dir, "infiniband_verbs", f"uverbs{index}")
        write(f"{v}/ibdev", dev["name"])
        write(f"{v}/abi_version", "1")
        write(f"{v}/dev", f"231:{192 + index}")
        verbs.append(f"uverbs{index}")
        print(f"sysfs_ib: {dev['name']} (uverbs{index}): net {sorted(netdevs) or 'none'}, "
              f"{sum(len(p['gids']) for p in dev['ports'].values())} GID(s)", file=sys.stderr)
    write(os.path.join(out_dir, "infiniband_verbs", "abi_version"), "6")
    write(os.path.join(out_dir, "uverbs.list"), "\n".join(verbs))


if __name__ == "__main__":
    main()

// SPDX-License-Identifier: MIT OR Apache-2.0
//
// The XDP program of the AF_XDP link (hca/src/link/xdp): RoCEv2 frames (UDP destination port
// 4791, IBTA vol. 1 Annex A17.2.2) in untagged Ethernet II carrying IPv4 without options or
// fragmentation, or IPv6 with UDP as the first next header, are redirected to the AF_XDP socket
// bound to the receive queue they arrived on (the XSKMAP entry at that queue index); every other
// frame (ARP, ICMP, TCP, other UDP, VLAN-tagged, IPv6 with extension headers) is passed to the
// kernel stack (XDP_PASS), and so is a RoCEv2 frame on a queue with no socket (the flags argument
// of bpf_redirect_map, Linux >= 5.3).
//
// The program is frags-aware (section "xdp.frags": BPF_F_XDP_HAS_FRAGS, Linux >= 5.18): a frame
// longer than one page (a 4096-byte RoCE path MTU over an interface MTU of 4200) arrives as a
// multi-buffer xdp_buff, its headers in the linear part this program reads, and reaches the
// socket as a chain of descriptors (the socket is bound with XDP_USE_SG). It also lets veth
// attach it natively at such MTUs (veth refuses a program without frags above about 3.5 KB).
//
// Built by hca/build.rs: clang -O2 -g -target bpf -c roce_redirect.bpf.c (libbpf-dev's
// bpf_helpers.h); loaded and attached by the `aya` crate.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ROCEV2_PORT 4791
// IPv4 fragment offset and More Fragments bits (RFC 791).
#define IP_FRAG_BITS 0x3fff

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} ROCE_XSKS SEC(".maps");

SEC("xdp.frags")
int roce_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct udphdr *udp;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		if (ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
		    (ip->frag_off & bpf_htons(IP_FRAG_BITS)))
			return XDP_PASS;
		udp = (void *)(ip + 1);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		if (ip6->nexthdr != IPPROTO_UDP)
			return XDP_PASS;
		udp = (void *)(ip6 + 1);
	} else {
		return XDP_PASS;
	}
	if ((void *)(udp + 1) > end)
		return XDP_PASS;
	if (udp->dest != bpf_htons(ROCEV2_PORT))
		return XDP_PASS;
	return bpf_redirect_map(&ROCE_XSKS, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0)
//
// HyperLoop's group primitives on the kernel's packet path (XDP).
//
// One program per group host, attached to every interface of the host's network namespace.
// A UDP datagram to the host's data port carrying a `struct ck_hdr` is one operation of one
// group (gWRITE, gCAS, gMEMCPY, gFLUSH). The program applies it to the member's region, a
// slot of the mmapable array `ck_regions` that the host process maps, and sends the same
// datagram on to the next member, or, at the tail, trims it into an acknowledgement for the
// caller. No process is woken on any replica: this runs in the softirq of whoever sent the
// datagram (on veth, the caller's own `sendto`).
//
// Order: each group's `next_seq` is claimed with a compare-and-swap (a busy bit while the
// operation is applied), so one operation at a time is applied per member, in sequence order.
// A duplicate (seq < next_seq) is not applied again but forwarded again with this member's
// remembered gCAS result, so a caller's retransmission repairs a loss anywhere down the
// chain. An operation ahead of a gap is dropped: the caller retransmits it (go-back-N). A
// write-lock gCAS that yields to readers (CK_FLAG_YIELDS_TO_READERS) and finds the node's
// reader count in its word is dropped the same way, unconsumed, so nothing behind it runs
// where the lock was not taken. See
// docs/protocols/hyperloop.md ("The kernel data path") for what user space does instead.
//
// Verifier notes: every dynamic offset into a region is bounded on its own
// (off <= CK_REGION_MAX, 1 <= len <= CK_CHUNK_MAX), and each slot has CK_CHUNK_MAX bytes of
// slack after CK_REGION_MAX, so the sum never leaves the map value.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "group.h"

#ifndef AF_INET
#define AF_INET 2
#endif

// Map values get BTF types (not bare value sizes), which aya's loader needs.
struct ck_slot {
	__u8 bytes[CK_SLOT_BYTES];
};

struct ck_chunk {
	__u8 bytes[CK_CHUNK_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ck_slot);
	__uint(max_entries, CK_SLOTS_DEFAULT); // user space may change it before loading
} ck_regions SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ck_group_key);
	__type(value, struct ck_group);
	__uint(max_entries, CK_GROUPS_MAX);
} ck_groups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ck_config);
	__uint(max_entries, 1);
} ck_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, CK_STAT_COUNT);
} ck_stats SEC(".maps");

// gMEMCPY goes through this buffer so that overlapping ranges behave like memmove.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ck_chunk);
	__uint(max_entries, 1);
} ck_scratch SEC(".maps");

static __always_inline void count(__u32 stat)
{
	__u64 *value = bpf_map_lookup_elem(&ck_stats, &stat);
	if (value)
		*value += 1;
}

static __always_inline int tokens_match(const __u8 *a, const __u8 *b)
{
	__u8 diff = 0;
#pragma unroll
	for (int i = 0; i < 16; i++)
		diff |= a[i] ^ b[i];
	return diff == 0;
}

static __always_inline __u16 ip_checksum(struct iphdr *ip)
{
	__u32 sum = 0;
	__u16 *words = (__u16 *)ip;
	ip->check = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(struct iphdr) / 2); i++)
		sum += words[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

// The same checks as `Operation::validate` for what fits one datagram, so the kernel and the
// sans-I/O model reject the same operations. `data_len` is the payload actually carried.
static __always_inline __u8 validate(const struct ck_hdr *hdr, const struct ck_group *g, __u32 data_len)
{
	__u64 region = g->region_bytes;
	switch (hdr->primitive) {
	case CK_WRITE:
		if (hdr->c != data_len)
			return CK_VERDICT_MALFORMED;
		if (hdr->a > region || hdr->c > region - hdr->a)
			return CK_VERDICT_OUT_OF_BOUNDS;
		return 0;
	case CK_CAS:
		if (hdr->a > region || 8 > region - hdr->a)
			return CK_VERDICT_OUT_OF_BOUNDS;
		if (hdr->a & 7)
			return CK_VERDICT_MISALIGNED;
		if (g->chain_len < 64 && (hdr->d >> g->chain_len) != 0)
			return CK_VERDICT_EXECUTE_MAP;
		return 0;
	case CK_MEMCPY:
		if (hdr->c > CK_CHUNK_MAX)
			return CK_VERDICT_MALFORMED;
		if (hdr->a > region || hdr->c > region - hdr->a)
			return CK_VERDICT_OUT_OF_BOUNDS;
		if (hdr->b > region || hdr->c > region - hdr->b)
			return CK_VERDICT_OUT_OF_BOUNDS;
		return 0;
	case CK_FLUSH:
		return 0;
	}
	return CK_VERDICT_MALFORMED;
}

// Apply a validated operation. Returns 0; 1 if it is a write lock that yields to readers and
// found the word holding only a reader count (its compare failed: nothing changed); or -1 if
// the verifier's bounds were not met (which validation rules out: the caller counts it and
// drops the datagram).
static __always_inline int apply(struct xdp_md *ctx, struct ck_hdr *hdr, struct ck_group *g, __u32 data_off,
				 __u64 *cas_original, int *cas_done)
{
	__u32 slot = g->slot;
	__u8 *region = bpf_map_lookup_elem(&ck_regions, &slot);
	if (!region)
		return -1;
	switch (hdr->primitive) {
	case CK_WRITE: {
		__u64 off = hdr->a;
		__u64 len = hdr->c;
		if (len == 0)
			return 0;
		if (off > CK_REGION_MAX || len > CK_CHUNK_MAX)
			return -1;
		if (bpf_xdp_load_bytes(ctx, data_off, region + off, len) < 0)
			return -1;
		return 0;
	}
	case CK_CAS: {
		if (!((hdr->d >> g->position) & 1))
			return 0;
		__u64 off = hdr->a;
		if (off > CK_REGION_MAX - 8)
			return -1;
		off &= ~7ULL;
		__u64 *word = (__u64 *)(region + off);
		__u64 original = __sync_val_compare_and_swap(word, hdr->b, hdr->c);
		if ((hdr->flags & CK_FLAG_YIELDS_TO_READERS) && original != hdr->b && original != 0 &&
		    !(original & CK_WRITER_BIT))
			return 1;
		*cas_original = original;
		*cas_done = 1;
		return 0;
	}
	case CK_MEMCPY: {
		__u64 src = hdr->a, dst = hdr->b;
		__u64 len = hdr->c;
		__u32 zero = 0;
		if (len == 0 || src == dst)
			return 0;
		if (src > CK_REGION_MAX || dst > CK_REGION_MAX || len > CK_CHUNK_MAX)
			return -1;
		__u8 *scratch = bpf_map_lookup_elem(&ck_scratch, &zero);
		if (!scratch)
			return -1;
		if (bpf_probe_read_kernel(scratch, len, region + src) < 0)
			return -1;
		if (bpf_probe_read_kernel(region + dst, len, scratch) < 0)
			return -1;
		return 0;
	}
	}
	return 0;
}

// Rewrite the datagram for `to_ip:to_port` from `from_ip:from_port` and redirect it out of
// the interface the routing table chooses (neighbour entry included).
static __always_inline int send_on(struct xdp_md *ctx, __u32 from_ip, __u16 from_port, __u32 to_ip,
				   __u16 to_port)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct udphdr *udp = (void *)ip + sizeof(*ip);
	if ((void *)(udp + 1) > data_end)
		return XDP_DROP;

	struct bpf_fib_lookup fib = {};
	fib.family = AF_INET;
	fib.tos = ip->tos;
	fib.l4_protocol = IPPROTO_UDP;
	fib.tot_len = bpf_ntohs(ip->tot_len);
	fib.ipv4_src = from_ip;
	fib.ipv4_dst = to_ip;
	// The kernel's forwarding lookup from the ingress interface (the host's namespace must
	// have IPv4 forwarding on: the datagram is forwarded, not delivered).
	fib.ifindex = ctx->ingress_ifindex;
	long rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
		count(rc == BPF_FIB_LKUP_RET_NO_NEIGH	  ? CK_STAT_NO_NEIGHBOUR
		      : rc == BPF_FIB_LKUP_RET_FWD_DISABLED ? CK_STAT_FORWARDING_OFF
							    : CK_STAT_NO_ROUTE);
		return XDP_DROP;
	}
	__builtin_memcpy(eth->h_dest, fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib.smac, ETH_ALEN);
	ip->saddr = from_ip;
	ip->daddr = to_ip;
	ip->ttl = 64;
	ip->check = ip_checksum(ip);
	udp->source = from_port;
	udp->dest = to_port;
	udp->check = 0; // IPv4 allows no checksum; offload state does not survive redirection
	return bpf_redirect(fib.ifindex, 0);
}

// The tail turns the operation into an acknowledgement: header only, kind ACK.
static __always_inline int acknowledge(struct xdp_md *ctx, struct ck_group *g, __u32 data_len)
{
	if (data_len > 0 && bpf_xdp_adjust_tail(ctx, -(int)data_len) < 0)
		return XDP_DROP;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct udphdr *udp = (void *)ip + sizeof(*ip);
	struct ck_hdr *hdr = (void *)(udp + 1);
	if ((void *)(hdr + 1) > data_end)
		return XDP_DROP;
	hdr->kind = CK_KIND_ACK;
	hdr->c = hdr->primitive == CK_WRITE ? 0 : hdr->c;
	ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*udp) + sizeof(*hdr));
	udp->len = bpf_htons(sizeof(*udp) + sizeof(*hdr));
	count(CK_STAT_ACKS);
	return send_on(ctx, g->src_ip, g->src_port, g->next_ip, g->next_port);
}

// Fill member `position`'s slot of the result map (a variable offset into the packet, so it is
// checked against the packet's end on its own).
static __always_inline int set_result(struct xdp_md *ctx, struct ck_hdr *hdr, __u32 position, __u64 value)
{
	void *data_end = (void *)(long)ctx->data_end;
	__u64 *slot = &hdr->results[position & (CK_CHAIN_MAX - 1)];
	if ((void *)(slot + 1) > data_end)
		return -1;
	*slot = value;
	hdr->present |= 1ULL << position;
	return 0;
}

static __always_inline void remember(struct ck_group *g, __u64 seq, __u64 value, int present)
{
	__u32 index = seq & (CK_RING - 1);
	struct ck_remembered *r = &g->ring[index];
	r->value = value;
	r->present = present;
	r->seq = seq;
}

// A one-sided read: copy `c` bytes at `a` of this member's region over the request's padding
// and send it back to its sender. No sequence number: reads do not order with operations
// (as an RDMA READ does not); the caller reads where it knows the state it wants is applied.
static __always_inline int serve_read(struct xdp_md *ctx, struct ck_group *g, struct iphdr *ip, struct udphdr *udp,
				      struct ck_hdr *hdr, __u32 data_off, __u32 data_len)
{
	__u64 off = hdr->a, len = hdr->c;
	if (len == 0 || len != data_len || off > g->region_bytes || len > g->region_bytes - off) {
		count(CK_STAT_MALFORMED);
		return XDP_DROP;
	}
	if (off > CK_REGION_MAX || len > CK_CHUNK_MAX)
		return XDP_DROP;
	__u32 slot = g->slot;
	__u8 *region = bpf_map_lookup_elem(&ck_regions, &slot);
	if (!region || bpf_xdp_store_bytes(ctx, data_off, region + off, len) < 0)
		return XDP_DROP;
	hdr->kind = CK_KIND_DATA;
	count(CK_STAT_READS);
	return send_on(ctx, ip->daddr, udp->dest, ip->saddr, udp->source);
}

SEC("xdp")
int ck_group_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct udphdr *udp = (void *)ip + sizeof(*ip);
	struct ck_hdr *hdr = (void *)(udp + 1);
	__u32 zero = 0;

	if ((void *)(udp + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	struct ck_config *config = bpf_map_lookup_elem(&ck_config, &zero);
	if (!config || config->port == 0 || udp->dest != config->port)
		return XDP_PASS;
	if (ip->frag_off & bpf_htons(0x3fff)) {
		count(CK_STAT_MALFORMED);
		return XDP_DROP;
	}
	if ((void *)(hdr + 1) > data_end || hdr->magic != CK_MAGIC ||
	    (hdr->kind != CK_KIND_OP && hdr->kind != CK_KIND_READ)) {
		count(CK_STAT_MALFORMED);
		return XDP_DROP;
	}
	__u32 data_off = sizeof(*eth) + sizeof(*ip) + sizeof(*udp) + sizeof(*hdr);
	__u32 data_len = (__u32)((long)data_end - (long)data) - data_off;
	if (data_len > CK_CHUNK_MAX) {
		count(CK_STAT_MALFORMED);
		return XDP_DROP;
	}
	if (config->loss_per_million &&
	    bpf_get_prandom_u32() % 1000000 < config->loss_per_million) {
		count(CK_STAT_INJECTED_LOSS);
		return XDP_DROP; // injected loss, for tests: as if the wire had lost it
	}

	struct ck_group_key key = { .tenant = hdr->tenant, .group = hdr->group };
	struct ck_group *g = bpf_map_lookup_elem(&ck_groups, &key);
	if (!g) {
		count(CK_STAT_UNKNOWN_GROUP);
		return XDP_DROP;
	}
	if (hdr->epoch != g->epoch || !tokens_match(hdr->token, g->token)) {
		count(CK_STAT_UNAUTHORIZED);
		return XDP_DROP;
	}
	if (hdr->kind == CK_KIND_READ)
		return serve_read(ctx, g, ip, udp, hdr, data_off, data_len);
	__u32 position = g->position;
	if (position >= CK_CHAIN_MAX)
		return XDP_DROP;

	__u64 seq = hdr->seq;
	__u64 next = g->next_seq;
	if (next & CK_BUSY) {
		count(CK_STAT_BUSY);
		return XDP_DROP;
	}
	if (seq < next) {
		// A duplicate: forward again with what this member remembered, never re-apply.
		struct ck_remembered *r = &g->ring[seq & (CK_RING - 1)];
		count(CK_STAT_DUPLICATES);
		if (r->seq != seq) {
			count(CK_STAT_FORGOTTEN);
			return XDP_DROP;
		}
		if (position == 0 && hdr->verdict == 0)
			hdr->verdict = validate(hdr, g, data_len);
		if (r->present && set_result(ctx, hdr, position, r->value) < 0)
			return XDP_DROP;
	} else if (seq > next) {
		count(CK_STAT_GAPS);
		return XDP_DROP; // ahead of a gap: the caller retransmits
	} else {
		if (__sync_val_compare_and_swap(&g->next_seq, next, next | CK_BUSY) != next) {
			count(CK_STAT_BUSY);
			return XDP_DROP;
		}
		// Only the head decides; the caller may mark its own operation rejected (it validated
		// an operation too large for one datagram), which changes nothing anywhere.
		__u8 mine = hdr->verdict == CK_VERDICT_BY_CALLER ? CK_VERDICT_BY_CALLER : validate(hdr, g, data_len);
		if (position == 0 && hdr->verdict != CK_VERDICT_BY_CALLER)
			hdr->verdict = mine;
		__u64 original = 0;
		int cas_done = 0;
		if (mine != hdr->verdict) {
			count(CK_STAT_VERDICT_MISMATCH);
			__sync_lock_test_and_set(&g->next_seq, next);
			return XDP_DROP;
		}
		if (hdr->verdict == 0) {
			int applied = apply(ctx, hdr, g, data_off, &original, &cas_done);
			if (applied < 0) {
				count(CK_STAT_MALFORMED);
				__sync_lock_test_and_set(&g->next_seq, next);
				return XDP_DROP;
			}
			if (applied > 0) {
				// The node's readers hold the lock word (for one lookup): refuse the write
				// lock, and with it everything pipelined behind it (dropped as ahead of a
				// gap), until the caller's retransmission finds the readers gone. Nothing
				// is applied, remembered, forwarded or acknowledged; next_seq stays.
				count(CK_STAT_YIELDED_TO_READERS);
				__sync_lock_test_and_set(&g->next_seq, next);
				return XDP_DROP;
			}
			count(CK_STAT_APPLIED);
		} else {
			count(CK_STAT_REJECTED);
		}
		remember(g, seq, original, cas_done);
		if (cas_done && set_result(ctx, hdr, position, original) < 0)
			return XDP_DROP;
		__sync_lock_test_and_set(&g->next_seq, next + 1);
	}

	if (position + 1 >= g->chain_len)
		return acknowledge(ctx, g, data_len);
	count(CK_STAT_FORWARDED);
	return send_on(ctx, g->src_ip, g->src_port, g->next_ip, g->next_port);
}

// For interfaces that only need to receive redirected frames (a veth peer needs NAPI).
SEC("xdp")
int ck_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";

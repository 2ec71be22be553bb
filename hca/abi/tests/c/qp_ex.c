/* The ibv_qp_ex work-request API (ibv_wr_post(3)) and the ibv_cq_ex polling API
 * (ibv_create_cq_ex(3)) of the drop-in libibverbs, built and run by tests/extended_verbs.rs:
 * two devices of one process (ROCE_DEVICES names rxe0 and rxe1 on two loopback addresses),
 * an RC QP on each, connected through GID index 0; every check prints what failed and exits 1. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(c, ...)                                                                  \
	do {                                                                           \
		if (!(c)) {                                                            \
			printf("FAIL line %d: ", __LINE__);                            \
			printf(__VA_ARGS__);                                           \
			printf(" (errno %d)\n", errno);                                 \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

#define BUF 8192

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	uint8_t *buf;
	union ibv_gid gid;
};

static void open_side(struct ibv_device *dev, struct side *s)
{
	s->ctx = ibv_open_device(dev);
	CHECK(s->ctx, "open %s", ibv_get_device_name(dev));
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd, "alloc_pd");
	s->buf = aligned_alloc(4096, BUF);
	memset(s->buf, 0, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(s->mr, "reg_mr");
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 64,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM,
	};
	s->cq = ibv_create_cq_ex(s->ctx, &ca);
	CHECK(s->cq, "create_cq_ex");
	CHECK(s->cq->read_byte_len && s->cq->read_imm_data && s->cq->read_qp_num &&
		      !s->cq->read_slid,
	      "read_* callbacks of the requested fields only");
	struct ibv_qp_init_attr_ex qa = {
		.send_cq = ibv_cq_ex_to_cq(s->cq),
		.recv_cq = ibv_cq_ex_to_cq(s->cq),
		.cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 4, .max_recv_sge = 4,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = s->pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
	};
	s->qp = ibv_create_qp_ex(s->ctx, &qa);
	CHECK(s->qp, "create_qp_ex");
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	CHECK(s->qpx == (struct ibv_qp_ex *)s->qp, "ibv_qp_to_qp_ex");
	CHECK(ibv_query_gid(s->ctx, 1, 0, &s->gid) == 0, "query_gid");
}

static void connect_to(struct side *s, struct side *peer)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						   IBV_ACCESS_REMOTE_ATOMIC};
	CHECK(ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
		      0,
	      "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	/* 25 bits: ibv_modify_qp keeps the low 24 (as rxe and mlx5 do). */
	a.rq_psn = 0x1000123;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0,
	      "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x1000123;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS");
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(s->qp, &q, IBV_QP_SQ_PSN, &qi) == 0 && q.sq_psn == 0x000123,
	      "PSN masked to 24 bits: %#x", q.sq_psn);
}

struct seen {
	uint64_t wr_id;
	int status;
	int opcode;
	uint32_t byte_len;
	uint32_t imm;
};

/* Polls `cq` with start_poll / next_poll / end_poll until `want` completions (bounded: 10 s). */
static int poll_ex(struct ibv_cq_ex *cq, struct seen *out, int want)
{
	int got = 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (got < want) {
		struct ibv_poll_cq_attr pa = {0};
		int rc = ibv_start_poll(cq, &pa);
		if (rc == ENOENT) {
			clock_gettime(CLOCK_MONOTONIC, &t);
			CHECK(t.tv_sec - t0.tv_sec < 10, "timed out with %d of %d completions", got,
			      want);
			continue;
		}
		CHECK(rc == 0, "start_poll %d", rc);
		do {
			struct seen *s = &out[got++];
			s->wr_id = cq->wr_id;
			s->status = cq->status;
			s->opcode = ibv_wc_read_opcode(cq);
			s->byte_len = ibv_wc_read_byte_len(cq);
			s->imm = (ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_IMM) ?
					 be32toh(ibv_wc_read_imm_data(cq)) : 0;
		} while (got < want && (rc = ibv_next_poll(cq)) == 0);
		ibv_end_poll(cq);
	}
	return got;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n >= 2, "two devices, got %d", n);
	struct side a, b;
	open_side(list[0], &a);
	open_side(list[1], &b);
	connect_to(&a, &b);
	connect_to(&b, &a);

	/* ibv_query_device_ex through verbs_context: the ibv_query_device attributes and more. */
	struct ibv_device_attr da;
	struct ibv_device_attr_ex dx;
	memset(&dx, 0xff, sizeof dx);
	CHECK(ibv_query_device(a.ctx, &da) == 0 && ibv_query_device_ex(a.ctx, NULL, &dx) == 0,
	      "query_device(_ex)");
	CHECK(memcmp(&da, &dx.orig_attr, sizeof da) == 0 && dx.phys_port_cnt_ex == 1 &&
		      dx.device_cap_flags_ex == da.device_cap_flags && dx.odp_caps.general_caps == 0,
	      "query_device_ex fields");
	CHECK(da.device_cap_flags & IBV_DEVICE_RC_RNR_NAK_GEN, "RNR NAK generation reported");

	/* Unsupported requests fail as rxe's do. */
	struct ibv_cq_init_attr_ex bad_cq = {.cqe = 4, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
	CHECK(!ibv_create_cq_ex(a.ctx, &bad_cq) && errno == EOPNOTSUPP, "timestamp CQ refused");
	struct ibv_qp_init_attr_ex bad_qp = {
		.send_cq = ibv_cq_ex_to_cq(a.cq), .recv_cq = ibv_cq_ex_to_cq(a.cq),
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_UD, .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = a.pd, .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE};
	CHECK(!ibv_create_qp_ex(a.ctx, &bad_qp) && errno == EOPNOTSUPP, "UD RDMA write refused");

	/* Three receives on b: the send, the send with immediate, the write with immediate. */
	for (int k = 0; k < 3; k++) {
		struct ibv_sge sge = {(uintptr_t)b.buf + 4096 + 256 * k, 256, b.mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = 100 + k, .sg_list = &sge, .num_sge = 1}, *bad;
		CHECK(ibv_post_recv(b.qp, &wr, &bad) == 0, "post_recv");
	}
	for (int k = 0; k < 64; k++)
		a.buf[k] = (uint8_t)(k + 1);
	*(uint64_t *)(b.buf + 2048) = 40;
	*(uint64_t *)(b.buf + 2056) = 7;
	memcpy(b.buf + 3000, "read me", 8);

	/* A batch that is aborted posts nothing. */
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 999;
	ibv_wr_send(a.qpx);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf, 8);
	ibv_wr_abort(a.qpx);

	/* Inline data over max_inline_data: wr_complete returns ENOSPC and posts nothing. */
	char big[4096] = {0};
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 998;
	ibv_wr_send(a.qpx);
	ibv_wr_set_inline_data(a.qpx, big, sizeof big);
	CHECK(ibv_wr_complete(a.qpx) == ENOSPC, "oversized inline refused");

	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 1;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(a.qpx, b.mr->rkey, (uintptr_t)b.buf);
	struct ibv_sge two[2] = {{(uintptr_t)a.buf, 16, a.mr->lkey},
				 {(uintptr_t)a.buf + 32, 16, a.mr->lkey}};
	ibv_wr_set_sge_list(a.qpx, 2, two);
	a.qpx->wr_id = 2;
	ibv_wr_send(a.qpx);
	char msg[24] = "inline, then overwritten";
	ibv_wr_set_inline_data(a.qpx, msg, 10);
	memset(msg, 'x', sizeof msg); /* the library copied it */
	a.qpx->wr_id = 3;
	ibv_wr_send_imm(a.qpx, htobe32(0xabcd1234));
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf, 4);
	a.qpx->wr_id = 4;
	ibv_wr_atomic_fetch_add(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 2048, 2);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 1024, 8);
	a.qpx->wr_id = 5;
	ibv_wr_atomic_cmp_swp(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 2056, 7, 77);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 1032, 8);
	a.qpx->wr_id = 6;
	ibv_wr_rdma_read(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 3000);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 1100, 8);
	a.qpx->wr_id = 7;
	ibv_wr_rdma_write_imm(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 512, htobe32(77));
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf, 0);
	CHECK(ibv_wr_complete(a.qpx) == 0, "wr_complete");

	struct seen sa[7];
	poll_ex(a.cq, sa, 7);
	int want_op[7] = {IBV_WC_RDMA_WRITE, IBV_WC_SEND, IBV_WC_SEND, IBV_WC_FETCH_ADD,
			  IBV_WC_COMP_SWAP, IBV_WC_RDMA_READ, IBV_WC_RDMA_WRITE};
	for (int k = 0; k < 7; k++) {
		CHECK(sa[k].wr_id == (uint64_t)k + 1 && sa[k].status == IBV_WC_SUCCESS &&
			      sa[k].opcode == want_op[k],
		      "sender completion %d: wr_id %llu status %d opcode %d", k,
		      (unsigned long long)sa[k].wr_id, sa[k].status, sa[k].opcode);
	}
	CHECK(ibv_start_poll(a.cq, NULL) == ENOENT, "aborted WR never completes");
	/* b: the send (10 inline bytes), the send with immediate, the write with immediate. */
	struct seen sb[3];
	poll_ex(b.cq, sb, 3);
	CHECK(sb[0].wr_id == 100 && sb[0].opcode == IBV_WC_RECV && sb[0].byte_len == 10,
	      "inline send received: wr_id %llu len %u", (unsigned long long)sb[0].wr_id,
	      sb[0].byte_len);
	CHECK(memcmp(b.buf + 4096, "inline, th", 10) == 0, "inline bytes");
	CHECK(sb[1].wr_id == 101 && sb[1].imm == 0xabcd1234 && sb[1].byte_len == 4,
	      "send with immediate: imm %#x", sb[1].imm);
	CHECK(sb[2].opcode == IBV_WC_RECV_RDMA_WITH_IMM && sb[2].imm == 77,
	      "write with immediate consumes a receive: opcode %d", sb[2].opcode);
	(void)sb;
	for (int k = 0; k < 16; k++)
		CHECK(b.buf[k] == k + 1 && b.buf[16 + k] == k + 33, "write gathered two SGEs");
	CHECK(*(uint64_t *)(b.buf + 2048) == 42 && *(uint64_t *)(a.buf + 1024) == 40,
	      "fetch and add");
	CHECK(*(uint64_t *)(b.buf + 2056) == 77 && *(uint64_t *)(a.buf + 1032) == 7,
	      "compare and swap");
	CHECK(memcmp(a.buf + 1100, "read me", 8) == 0, "RDMA read");

	CHECK(ibv_destroy_qp(a.qp) == 0 && ibv_destroy_qp(b.qp) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(a.cq)) == 0 && ibv_destroy_cq(ibv_cq_ex_to_cq(b.cq)) == 0,
	      "destroy_cq");
	ibv_dereg_mr(a.mr);
	ibv_dereg_mr(b.mr);
	ibv_dealloc_pd(a.pd);
	ibv_dealloc_pd(b.pd);
	ibv_close_device(a.ctx);
	ibv_close_device(b.ctx);
	ibv_free_device_list(list);
	printf("qp_ex and cq_ex: all checks passed\n");
	return 0;
}

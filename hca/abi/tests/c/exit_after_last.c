/* A responder that exits right after its last completion, without destroying anything, on the
 * drop-in libibverbs: the ACK of the last SEND it received must still reach the requester, whose
 * send then completes with IBV_WC_SUCCESS (not IBV_WC_RETRY_EXC_ERR). The library's polling
 * rounds hold a received message's ACK for the reply (hca::soft::ACK_HOLD); exit(3) must send it
 * (the library's atexit handler). Built and run by tests/extended_verbs.rs with two devices
 * (ROCE_DEVICES rxe0, rxe1 on two loopback addresses): the parent is the requester on rxe0, a
 * forked child the responder on rxe1 (each opens its device after fork); QPN and GID travel
 * over pipes. ITERS ping-pongs (the reply carries the held ACK), then the last SEND. The
 * requester's Local ACK Timeout is short (timeout 12: 16.8 ms, retry_cnt 2), so a lost ACK
 * fails in about 50 ms. Every check prints what failed and exits 1; every wait is bounded. */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ITERS 200
#define ROUNDS 5

#define CHECK(c, ...)                                                                  \
	do {                                                                           \
		if (!(c)) {                                                            \
			printf("FAIL line %d (pid %d): ", __LINE__, (int)getpid());    \
			printf(__VA_ARGS__);                                           \
			printf(" (errno %d)\n", errno);                                 \
			fflush(stdout);                                                \
			_exit(1);                                                      \
		}                                                                      \
	} while (0)

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
	int seen[3]; /* completions polled but not yet waited for, by wr_id */
};

struct wire {
	uint32_t qpn;
	union ibv_gid gid;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_device *find(const char *name)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list, "get_device_list");
	for (int i = 0; i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			return list[i];
	CHECK(0, "no device %s", name);
	return NULL;
}

static void make(const char *name, struct end *e)
{
	e->ctx = ibv_open_device(find(name));
	CHECK(e->ctx, "open %s", name);
	e->pd = ibv_alloc_pd(e->ctx);
	e->buf = calloc(1, 4096);
	e->mr = ibv_reg_mr(e->pd, e->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	e->cq = ibv_create_cq(e->ctx, 16, NULL, NULL, 0);
	CHECK(e->pd && e->buf && e->mr && e->cq, "pd, mr, cq");
	struct ibv_qp_init_attr qa = {.send_cq = e->cq, .recv_cq = e->cq,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
					      .max_recv_sge = 1},
				      .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
	e->qp = ibv_create_qp(e->pd, &qa);
	CHECK(e->qp, "create_qp");
	CHECK(ibv_query_gid(e->ctx, 1, 0, &e->gid) == 0, "query_gid");
}

static void connect_to(struct end *e, const struct wire *peer)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
		      0,
	      "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0,
	      "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 12;
	a.retry_cnt = 2;
	a.rnr_retry = 7;
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS");
}

static void post_recv(struct end *e)
{
	struct ibv_sge sge = {.addr = (uintptr_t)e->buf, .length = 64, .lkey = e->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1}, *bad;
	CHECK(ibv_post_recv(e->qp, &wr, &bad) == 0, "post_recv");
}

static void post_send(struct end *e, uint32_t value)
{
	memcpy(e->buf + 1024, &value, sizeof value);
	struct ibv_sge sge = {.addr = (uintptr_t)e->buf + 1024, .length = 8, .lkey = e->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	CHECK(ibv_post_send(e->qp, &wr, &bad) == 0, "post_send");
}

/* Busy-polls until a completion with `wr_id` (1: send, 2: receive) has come (10 s at most);
 * checks every status. The send's and the receive's completions may come in either order. */
static void wait_wc(struct end *e, uint64_t wr_id, const char *what)
{
	double deadline = now_s() + 10;
	for (;;) {
		if (e->seen[wr_id] > 0) {
			e->seen[wr_id]--;
			return;
		}
		struct ibv_wc wc;
		int n = ibv_poll_cq(e->cq, 1, &wc);
		CHECK(n >= 0, "poll_cq");
		if (n == 1) {
			CHECK(wc.status == IBV_WC_SUCCESS, "%s: status %s", what,
			      ibv_wc_status_str(wc.status));
			CHECK(wc.wr_id == 1 || wc.wr_id == 2, "wr_id %llu",
			      (unsigned long long)wc.wr_id);
			e->seen[wc.wr_id]++;
			continue;
		}
		CHECK(now_s() < deadline, "%s: no completion in 10 s", what);
	}
}

static void xfer(int fd, void *p, size_t n, int out)
{
	char *c = p;
	while (n > 0) {
		ssize_t r = out ? write(fd, c, n) : read(fd, c, n);
		CHECK(r > 0, "pipe");
		c += r;
		n -= (size_t)r;
	}
}

/* One round: a fresh responder process that exits right after its last completion. */
static void round_once(int round)
{
	int to_child[2], to_parent[2];
	CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipe");
	fflush(stdout);
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct end s = {0};
		make("rxe1", &s);
		struct wire mine = {.qpn = s.qp->qp_num, .gid = s.gid}, peer;
		xfer(to_parent[1], &mine, sizeof mine, 1);
		xfer(to_child[0], &peer, sizeof peer, 0);
		connect_to(&s, &peer);
		post_recv(&s);
		char ready = 1;
		xfer(to_parent[1], &ready, 1, 1);
		for (int i = 0; i <= ITERS; i++) {
			wait_wc(&s, 2, "responder receive");
			if (i == ITERS)
				/* The last completion: leave at once, nothing destroyed. */
				exit(0);
			post_recv(&s);
			post_send(&s, (uint32_t)i);
			wait_wc(&s, 1, "responder send");
		}
		_exit(1);
	}
	struct end c = {0};
	make("rxe0", &c);
	struct wire mine = {.qpn = c.qp->qp_num, .gid = c.gid}, peer;
	xfer(to_child[1], &mine, sizeof mine, 1);
	xfer(to_parent[0], &peer, sizeof peer, 0);
	connect_to(&c, &peer);
	char ready;
	xfer(to_parent[0], &ready, 1, 0);
	for (int i = 0; i < ITERS; i++) {
		post_recv(&c);
		post_send(&c, (uint32_t)i);
		wait_wc(&c, 1, "requester send");
		wait_wc(&c, 2, "requester receive");
	}
	/* The last SEND: its ACK is the one the responder holds when it exits. */
	post_send(&c, ITERS);
	wait_wc(&c, 1, "requester's last send (its ACK held by a responder that exited)");
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "responder exit status %d", status);
	ibv_destroy_qp(c.qp);
	ibv_destroy_cq(c.cq);
	ibv_dereg_mr(c.mr);
	ibv_dealloc_pd(c.pd);
	ibv_close_device(c.ctx);
	free(c.buf);
	for (int i = 0; i < 2; i++) {
		close(to_child[i]);
		close(to_parent[i]);
	}
	printf("round %d: %d ping-pongs, last send acknowledged by an exited responder\n", round,
	       ITERS);
}

int main(void)
{
	for (int r = 0; r < ROUNDS; r++)
		round_once(r);
	printf("all checks passed\n");
	return 0;
}

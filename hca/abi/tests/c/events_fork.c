/* Completion channels and the async event descriptor under epoll(7), ibv_fork_init(3) and
 * fork(2), and ibv_reg_dmabuf_mr(3)'s refusals, on the drop-in libibverbs; built and run by
 * tests/extended_verbs.rs with four devices of one process (ROCE_DEVICES rxe0..rxe3 on four
 * loopback addresses). Every check prints what failed and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c, ...)                                                                  \
	do {                                                                           \
		if (!(c)) {                                                            \
			printf("FAIL line %d (pid %d): ", __LINE__, (int)getpid());    \
			printf(__VA_ARGS__);                                           \
			printf(" (errno %d)\n", errno);                                 \
			fflush(stdout);                                                \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

struct end {
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static void make(struct ibv_device *dev, struct end *e, int with_channel)
{
	e->ctx = ibv_open_device(dev);
	CHECK(e->ctx, "open %s", ibv_get_device_name(dev));
	e->ch = with_channel ? ibv_create_comp_channel(e->ctx) : NULL;
	CHECK(!with_channel || e->ch, "create_comp_channel");
	e->pd = ibv_alloc_pd(e->ctx);
	e->buf = calloc(1, 4096);
	e->mr = ibv_reg_mr(e->pd, e->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	e->cq = ibv_create_cq(e->ctx, 16, e, e->ch, 0);
	CHECK(e->pd && e->mr && e->cq, "pd, mr, cq");
	struct ibv_qp_init_attr qa = {.send_cq = e->cq, .recv_cq = e->cq,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
					      .max_recv_sge = 1},
				      .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
	e->qp = ibv_create_qp(e->pd, &qa);
	CHECK(e->qp, "create_qp");
	CHECK(ibv_query_gid(e->ctx, 1, 0, &e->gid) == 0, "query_gid");
}

static void connect_to(struct end *e, struct end *peer)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
		      0,
	      "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
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
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS");
}

/* Polls one completion of `cq` (bounded: 10 s). */
static struct ibv_wc poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "poll_cq");
		if (n == 1)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		CHECK(t.tv_sec - t0.tv_sec < 10, "no completion in 10 s");
	}
}

/* Sends `msg` from `s` to `r` and checks it arrived; the sender's completion is polled unless
 * `wait_sender` is 0 (the caller takes it through the channel). */
static void send_recv(struct end *s, struct end *r, const char *msg, int wait_sender)
{
	size_t len = strlen(msg) + 1;
	struct ibv_sge rs = {(uintptr_t)r->buf, 256, r->mr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(r->qp, &rw, &rbad) == 0, "post_recv");
	memcpy(s->buf + 512, msg, len);
	struct ibv_sge ss = {(uintptr_t)s->buf + 512, (uint32_t)len, s->mr->lkey};
	struct ibv_send_wr sw = {.wr_id = 9, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_SEND}, *sbad;
	CHECK(ibv_post_send(s->qp, &sw, &sbad) == 0, "post_send");
	struct ibv_wc wc = poll1(r->cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.byte_len == len, "receive");
	CHECK(strcmp(r->buf, msg) == 0, "data");
	if (wait_sender) {
		wc = poll1(s->cq);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 9, "send completion");
	}
}

int main(void)
{
	CHECK(ibv_fork_init() == 0, "ibv_fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "fork support unneeded");
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n >= 4, "four devices, got %d", n);
	struct end a, b;
	make(list[0], &a, 1);
	make(list[1], &b, 0);
	connect_to(&a, &b);
	connect_to(&b, &a);

	/* dma-buf MRs: no dma-buf, no MR, EOPNOTSUPP (NCCL probes with fd -1). */
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(a.pd, 0, 0, 0, -1, 0) && errno == EOPNOTSUPP, "dmabuf fd -1");
	int mfd = memfd_create("not-a-dmabuf", 0);
	CHECK(mfd >= 0 && ftruncate(mfd, 4096) == 0, "memfd");
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(a.pd, 0, 4096, 0, mfd, IBV_ACCESS_LOCAL_WRITE) &&
		      errno == EOPNOTSUPP,
	      "a memfd is not a dma-buf");
	close(mfd);

	/* The completion channel's and the async event descriptors under epoll. */
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 1};
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, a.ch->fd, &ev) == 0, "epoll add channel");
	ev.data.u32 = 2;
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, a.ctx->async_fd, &ev) == 0, "epoll add async_fd");
	struct epoll_event got[4];
	CHECK(epoll_wait(ep, got, 4, 0) == 0, "nothing ready before any completion");
	CHECK(ibv_req_notify_cq(a.cq, 0) == 0, "req_notify_cq");
	send_recv(&a, &b, "through the channel", 0);
	int k = epoll_wait(ep, got, 4, 10000);
	CHECK(k == 1 && got[0].data.u32 == 1, "the channel is readable: %d events", k);
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(ibv_get_cq_event(a.ch, &ecq, &ectx) == 0 && ecq == a.cq && ectx == &a,
	      "get_cq_event");
	ibv_ack_cq_events(ecq, 1);
	struct ibv_wc wc = poll1(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 9, "completion after the event");
	CHECK(epoll_wait(ep, got, 4, 0) == 0, "nothing ready after the event is taken");
	/* Not re-armed: no event; a non-blocking channel says EAGAIN. */
	int fl = fcntl(a.ch->fd, F_GETFL);
	CHECK(fcntl(a.ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	send_recv(&a, &b, "not armed", 1);
	errno = 0;
	CHECK(ibv_get_cq_event(a.ch, &ecq, &ectx) == -1 && errno == EAGAIN, "EAGAIN");
	struct ibv_async_event aev;
	fl = fcntl(a.ctx->async_fd, F_GETFL);
	CHECK(fcntl(a.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "async O_NONBLOCK");
	errno = 0;
	CHECK(ibv_get_async_event(a.ctx, &aev) == -1 && errno == EAGAIN, "no async event");

	/* fork(2): the child works with devices of its own while the parent keeps using its. */
	fflush(stdout);
	pid_t child = fork();
	CHECK(child >= 0, "fork");
	if (child == 0) {
		/* The parent's device stays the parent's: its address is bound (by the socket this
		 * child inherited), so opening it here fails at once instead of sharing an HCA whose
		 * progress thread did not survive fork (run with SOFT_HCA_SHARE=0: one process per
		 * device address). */
		errno = 0;
		CHECK(!ibv_open_device(list[0]) && errno != 0, "parent's device in the child");
		struct end c, d;
		make(list[2], &c, 0);
		make(list[3], &d, 0);
		connect_to(&c, &d);
		connect_to(&d, &c);
		for (int i = 0; i < 5; i++) {
			send_recv(&c, &d, "from the child", 1);
			send_recv(&d, &c, "back in the child", 1);
		}
		printf("child: ok\n");
		fflush(stdout);
		_exit(0);
	}
	for (int i = 0; i < 5; i++) {
		send_recv(&a, &b, "parent after fork", 1);
		send_recv(&b, &a, "and back", 1);
	}
	int st = 0;
	CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "child status %d", st);
	send_recv(&a, &b, "parent after the child exited", 1);
	ibv_destroy_qp(a.qp);
	ibv_destroy_qp(b.qp);
	ibv_destroy_cq(a.cq);
	ibv_destroy_cq(b.cq);
	CHECK(ibv_destroy_comp_channel(a.ch) == 0, "destroy channel");
	ibv_close_device(a.ctx);
	ibv_close_device(b.ctx);
	ibv_free_device_list(list);
	printf("events, fork and dma-buf: all checks passed\n");
	return 0;
}

/* rdma_conn_param through the drop-in librdmacm.so.1, client and server in one process on two
 * devices (rxe0 the server, rxe1 the client; ROCE_DEVICES): the caller's depths and retry counts
 * reach the peer's CONNECT_REQUEST from its own view and the QPs (ibv_query_qp), the active
 * side's ESTABLISHED carries the REP's, the passive one's none (as Linux cma.c reports them); a
 * depth above the device's is EINVAL (librdmacm ucma_valid_param); a UD ID's rdma_init_qp_attr
 * gives RDMA_UDP_QKEY. Prints "all checks passed" and exits 0, or names the failed check. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static int failures;
#define CHECK(c)                                                              \
	do {                                                                  \
		if (!(c)) {                                                   \
			printf("FAILED line %d: %s\n", __LINE__, #c);         \
			failures++;                                           \
		}                                                             \
	} while (0)

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type t)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e)) {
		perror("rdma_get_cm_event");
		exit(2);
	}
	if (e->event != t) {
		printf("got %s (status %d), want %s\n", rdma_event_str(e->event), e->status,
		       rdma_event_str(t));
		exit(2);
	}
	return e;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, NULL, &a)) {
		perror("rdma_create_qp");
		exit(2);
	}
}

static void qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *a)
{
	struct ibv_qp_init_attr init;
	if (ibv_query_qp(id->qp, a, IBV_QP_STATE | IBV_QP_MAX_DEST_RD_ATOMIC |
			 IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			 IBV_QP_TIMEOUT, &init)) {
		perror("ibv_query_qp");
		exit(2);
	}
}

int main(int argc, char **argv)
{
	const char *srv = argc > 2 ? argv[1] : "127.0.0.61";
	const char *cli = argc > 2 ? argv[2] : "127.0.0.62";
	struct sockaddr_in s_addr = { .sin_family = AF_INET, .sin_port = htons(7961) };
	struct sockaddr_in c_addr = { .sin_family = AF_INET };
	struct rdma_event_channel *s_ch = rdma_create_event_channel();
	struct rdma_event_channel *c_ch = rdma_create_event_channel();
	struct rdma_cm_id *lid, *cid, *sid, *uid;
	struct rdma_conn_param p;
	struct rdma_cm_event *e;
	struct ibv_qp_attr qa;
	int mask;

	inet_pton(AF_INET, srv, &s_addr.sin_addr);
	inet_pton(AF_INET, cli, &c_addr.sin_addr);
	if (!s_ch || !c_ch || rdma_create_id(s_ch, &lid, NULL, RDMA_PS_TCP) ||
	    rdma_create_id(c_ch, &cid, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(lid, (struct sockaddr *)&s_addr) || rdma_listen(lid, 1)) {
		perror("setup");
		return 2;
	}
	if (rdma_resolve_addr(cid, (struct sockaddr *)&c_addr, (struct sockaddr *)&s_addr, 2000)) {
		perror("rdma_resolve_addr");
		return 2;
	}
	rdma_ack_cm_event(expect(c_ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	rdma_resolve_route(cid, 2000);
	rdma_ack_cm_event(expect(c_ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	make_qp(cid);

	memset(&p, 0, sizeof p);
	p.responder_resources = 200; /* the device allows 128 */
	CHECK(rdma_connect(cid, &p) == -1 && errno == EINVAL);

	p.responder_resources = 3;
	p.initiator_depth = 2;
	p.retry_count = 5;
	p.rnr_retry_count = 6;
	p.private_data = "hi";
	p.private_data_len = 3;
	CHECK(rdma_connect(cid, &p) == 0);

	e = expect(s_ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = e->id;
	/* From the server's view: the client's initiator depth is what it serves. */
	CHECK(e->param.conn.responder_resources == 2);
	CHECK(e->param.conn.initiator_depth == 3);
	CHECK(e->param.conn.retry_count == 5);
	CHECK(e->param.conn.rnr_retry_count == 6);
	CHECK(e->param.conn.qp_num == cid->qp->qp_num);
	CHECK(e->param.conn.private_data_len == 56);
	CHECK(e->param.conn.private_data && !strcmp(e->param.conn.private_data, "hi"));
	rdma_ack_cm_event(e);
	make_qp(sid);
	memset(&p, 0, sizeof p);
	p.responder_resources = RDMA_MAX_RESP_RES; /* the request's 2 */
	p.initiator_depth = 1;
	p.rnr_retry_count = 4;
	CHECK(rdma_accept(sid, &p) == 0);

	e = expect(c_ch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->param.conn.responder_resources == 1);
	CHECK(e->param.conn.initiator_depth == 2);
	CHECK(e->param.conn.rnr_retry_count == 4);
	CHECK(e->param.conn.qp_num == sid->qp->qp_num);
	rdma_ack_cm_event(e);
	e = expect(s_ch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->param.conn.responder_resources == 0 && e->param.conn.qp_num == 0);
	rdma_ack_cm_event(e);

	qp_attr(cid, &qa);
	CHECK(qa.qp_state == IBV_QPS_RTS);
	CHECK(qa.max_dest_rd_atomic == 3 && qa.max_rd_atomic == 2);
	CHECK(qa.retry_cnt == 5 && qa.rnr_retry == 4 && qa.timeout == 17);
	qp_attr(sid, &qa);
	CHECK(qa.max_dest_rd_atomic == 2 && qa.max_rd_atomic == 1);
	CHECK(qa.retry_cnt == 5 && qa.rnr_retry == 6 && qa.timeout == 17);

	rdma_disconnect(cid);
	rdma_ack_cm_event(expect(c_ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(expect(s_ch, RDMA_CM_EVENT_DISCONNECTED));

	/* A UD ID: INIT attributes with RDMA_UDP_QKEY, RTS with SQ PSN 0. */
	CHECK(rdma_create_id(c_ch, &uid, NULL, RDMA_PS_UDP) == 0);
	CHECK(uid->qp_type == IBV_QPT_UD);
	memset(&qa, 0, sizeof qa);
	qa.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(uid, &qa, &mask) == 0);
	CHECK(qa.qkey == 0x01234567 && (mask & IBV_QP_QKEY) && qa.port_num == 1);
	qa.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(uid, &qa, &mask) == 0);
	CHECK(mask == (IBV_QP_STATE | IBV_QP_SQ_PSN) && qa.sq_psn == 0);
	rdma_destroy_id(uid);

	rdma_destroy_qp(cid);
	rdma_destroy_qp(sid);
	rdma_destroy_id(cid);
	rdma_destroy_id(sid);
	rdma_destroy_id(lid);
	if (failures)
		return 1;
	printf("all checks passed\n");
	return 0;
}

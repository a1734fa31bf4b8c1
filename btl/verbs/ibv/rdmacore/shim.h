// C helpers of the rdmacore provider: the inline verbs (post, poll,
// notify, query_port) wrapped as functions cgo can call, and work requests
// and completions translated between libibverbs' structs (with unions cgo
// cannot name) and plain structs the Go side fills and reads.
#ifndef GOMPI_RDMACORE_SHIM_H
#define GOMPI_RDMACORE_SHIM_H

#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// A send work request without pointers: its SGEs are the nsge entries
// after those of the previous requests in the same post.
typedef struct {
	uint64_t id, raddr, compare_add, swap;
	uint32_t imm, rkey;
	int32_t opcode, flags, nsge;
} gompi_swr;

typedef struct {
	uint64_t id;
	int32_t nsge;
} gompi_rwr;

// A work completion with the immediate in host order.
typedef struct {
	uint64_t id;
	uint32_t status, opcode, vendor_err, byte_len, imm, qp_num, src_qp, flags;
} gompi_wc;

// The QP attributes of the model, flat.
typedef struct {
	uint32_t state, cur_state, path_mtu, qkey, rq_psn, sq_psn, dest_qpn, access;
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
	uint32_t dlid, sl, is_global, sgid_index, hop_limit, tclass, flow_label, ah_port;
	uint8_t dgid[16];
	uint32_t pkey_index, sqd_drain, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer;
	uint32_t port, timeout, retry_cnt, rnr_retry;
} gompi_qp_attr;

static int gompi_errno(int r) { return r < 0 ? errno : r; }

static int gompi_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	return gompi_errno(ibv_query_port(c, port, a));
}

// gompi_post_send builds nwr ibv_send_wr in wrs (C memory) from swr and
// sges and posts them; *bad is the index of the first refused request.
static int gompi_post_send(struct ibv_qp *qp, gompi_swr *swr, int nwr, struct ibv_sge *sges,
			   struct ibv_send_wr *wrs, int *bad) {
	struct ibv_sge *sg = sges;
	for (int i = 0; i < nwr; i++) {
		struct ibv_send_wr *w = &wrs[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = swr[i].id;
		w->next = i + 1 < nwr ? &wrs[i + 1] : NULL;
		w->sg_list = swr[i].nsge ? sg : NULL;
		w->num_sge = swr[i].nsge;
		sg += swr[i].nsge;
		w->opcode = (enum ibv_wr_opcode)swr[i].opcode;
		w->send_flags = (unsigned int)swr[i].flags;
		w->imm_data = htobe32(swr[i].imm);
		if (w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			w->wr.atomic.remote_addr = swr[i].raddr;
			w->wr.atomic.rkey = swr[i].rkey;
			w->wr.atomic.compare_add = swr[i].compare_add;
			w->wr.atomic.swap = swr[i].swap;
		} else {
			w->wr.rdma.remote_addr = swr[i].raddr;
			w->wr.rdma.rkey = swr[i].rkey;
		}
	}
	struct ibv_send_wr *b = NULL;
	int r = ibv_post_send(qp, wrs, &b);
	*bad = b ? (int)(b - wrs) : 0;
	return gompi_errno(r);
}

static int gompi_post_recv(struct ibv_qp *qp, gompi_rwr *rwr, int nwr, struct ibv_sge *sges,
			   struct ibv_recv_wr *wrs, int *bad) {
	struct ibv_sge *sg = sges;
	for (int i = 0; i < nwr; i++) {
		struct ibv_recv_wr *w = &wrs[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = rwr[i].id;
		w->next = i + 1 < nwr ? &wrs[i + 1] : NULL;
		w->sg_list = rwr[i].nsge ? sg : NULL;
		w->num_sge = rwr[i].nsge;
		sg += rwr[i].nsge;
	}
	struct ibv_recv_wr *b = NULL;
	int r = ibv_post_recv(qp, wrs, &b);
	*bad = b ? (int)(b - wrs) : 0;
	return gompi_errno(r);
}

// gompi_poll_cq polls up to n completions through raw (C memory) into out.
// It returns the count, or -errno.
static int gompi_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *raw, gompi_wc *out) {
	int k = ibv_poll_cq(cq, n, raw);
	if (k < 0)
		return k;
	for (int i = 0; i < k; i++) {
		out[i].id = raw[i].wr_id;
		out[i].status = raw[i].status;
		out[i].opcode = raw[i].opcode;
		out[i].vendor_err = raw[i].vendor_err;
		out[i].byte_len = raw[i].byte_len;
		out[i].imm = (raw[i].wc_flags & IBV_WC_WITH_IMM) ? be32toh(raw[i].imm_data) : 0;
		out[i].qp_num = raw[i].qp_num;
		out[i].src_qp = raw[i].src_qp;
		out[i].flags = raw[i].wc_flags;
	}
	return k;
}

static int gompi_req_notify_cq(struct ibv_cq *cq, int solicited_only) {
	return gompi_errno(ibv_req_notify_cq(cq, solicited_only));
}

static int gompi_set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return errno;
	return 0;
}

// gompi_get_cq_event takes one event from a non-blocking channel: 0 and
// the CQ, or EAGAIN when there is none.
static int gompi_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq) {
	void *ctx;
	if (ibv_get_cq_event(ch, cq, &ctx))
		return errno ? errno : EAGAIN;
	return 0;
}

// gompi_get_async_event takes one async event: its type and the CQ or QP
// it names (or NULL), acknowledged at once. EAGAIN when there is none.
static int gompi_get_async_event(struct ibv_context *c, int *type, struct ibv_cq **cq, struct ibv_qp **qp) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(c, &ev))
		return errno ? errno : EAGAIN;
	*type = ev.event_type;
	*cq = NULL;
	*qp = NULL;
	switch (ev.event_type) {
	case IBV_EVENT_CQ_ERR:
		*cq = ev.element.cq;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		*qp = ev.element.qp;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

static int gompi_modify_qp(struct ibv_qp *qp, const gompi_qp_attr *g, int mask) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = (enum ibv_qp_state)g->state;
	a.cur_qp_state = (enum ibv_qp_state)g->cur_state;
	a.path_mtu = (enum ibv_mtu)g->path_mtu;
	a.qkey = g->qkey;
	a.rq_psn = g->rq_psn;
	a.sq_psn = g->sq_psn;
	a.dest_qp_num = g->dest_qpn;
	a.qp_access_flags = g->access;
	a.cap.max_send_wr = g->max_send_wr;
	a.cap.max_recv_wr = g->max_recv_wr;
	a.cap.max_send_sge = g->max_send_sge;
	a.cap.max_recv_sge = g->max_recv_sge;
	a.cap.max_inline_data = g->max_inline;
	a.ah_attr.dlid = g->dlid;
	a.ah_attr.sl = g->sl;
	a.ah_attr.is_global = g->is_global;
	a.ah_attr.port_num = g->ah_port;
	memcpy(a.ah_attr.grh.dgid.raw, g->dgid, 16);
	a.ah_attr.grh.sgid_index = g->sgid_index;
	a.ah_attr.grh.hop_limit = g->hop_limit;
	a.ah_attr.grh.traffic_class = g->tclass;
	a.ah_attr.grh.flow_label = g->flow_label;
	a.pkey_index = g->pkey_index;
	a.en_sqd_async_notify = g->sqd_drain;
	a.max_rd_atomic = g->max_rd_atomic;
	a.max_dest_rd_atomic = g->max_dest_rd_atomic;
	a.min_rnr_timer = g->min_rnr_timer;
	a.port_num = g->port;
	a.timeout = g->timeout;
	a.retry_cnt = g->retry_cnt;
	a.rnr_retry = g->rnr_retry;
	return gompi_errno(ibv_modify_qp(qp, &a, mask));
}

static int gompi_query_qp(struct ibv_qp *qp, gompi_qp_attr *g, int mask) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	memset(&ia, 0, sizeof(ia));
	int r = ibv_query_qp(qp, &a, mask, &ia);
	if (r)
		return gompi_errno(r);
	memset(g, 0, sizeof(*g));
	g->state = a.qp_state;
	g->cur_state = a.cur_qp_state;
	g->path_mtu = a.path_mtu;
	g->qkey = a.qkey;
	g->rq_psn = a.rq_psn;
	g->sq_psn = a.sq_psn;
	g->dest_qpn = a.dest_qp_num;
	g->access = a.qp_access_flags;
	g->max_send_wr = ia.cap.max_send_wr;
	g->max_recv_wr = ia.cap.max_recv_wr;
	g->max_send_sge = ia.cap.max_send_sge;
	g->max_recv_sge = ia.cap.max_recv_sge;
	g->max_inline = ia.cap.max_inline_data;
	g->dlid = a.ah_attr.dlid;
	g->sl = a.ah_attr.sl;
	g->is_global = a.ah_attr.is_global;
	g->ah_port = a.ah_attr.port_num;
	memcpy(g->dgid, a.ah_attr.grh.dgid.raw, 16);
	g->sgid_index = a.ah_attr.grh.sgid_index;
	g->hop_limit = a.ah_attr.grh.hop_limit;
	g->tclass = a.ah_attr.grh.traffic_class;
	g->flow_label = a.ah_attr.grh.flow_label;
	g->pkey_index = a.pkey_index;
	g->sqd_drain = a.sq_draining;
	g->max_rd_atomic = a.max_rd_atomic;
	g->max_dest_rd_atomic = a.max_dest_rd_atomic;
	g->min_rnr_timer = a.min_rnr_timer;
	g->port = a.port_num;
	g->timeout = a.timeout;
	g->retry_cnt = a.retry_cnt;
	g->rnr_retry = a.rnr_retry;
	return 0;
}

static const char *gompi_device_name(struct ibv_device **list, int i) {
	return ibv_get_device_name(list[i]);
}

static struct ibv_device *gompi_device_at(struct ibv_device **list, int i) { return list[i]; }

static int gompi_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *out) {
	union ibv_gid g;
	int r = ibv_query_gid(c, port, index, &g);
	if (r)
		return gompi_errno(r);
	memcpy(out, g.raw, 16);
	return 0;
}

// The model's constants are verbs.h's values; a header that changed them
// fails the build here rather than the device at run time.
_Static_assert(IBV_QP_STATE == 1 << 0 && IBV_QP_ACCESS_FLAGS == 1 << 3 && IBV_QP_AV == 1 << 7 &&
	       IBV_QP_RNR_RETRY == 1 << 11 && IBV_QP_SQ_PSN == 1 << 16 && IBV_QP_DEST_QPN == 1 << 20, "attr mask");
_Static_assert(IBV_ACCESS_LOCAL_WRITE == 1 && IBV_ACCESS_REMOTE_WRITE == 2 && IBV_ACCESS_REMOTE_READ == 4 &&
	       IBV_ACCESS_REMOTE_ATOMIC == 8, "access flags");
_Static_assert(IBV_QPS_RESET == 0 && IBV_QPS_RTS == 3 && IBV_QPS_ERR == 6, "QP states");
_Static_assert(IBV_WR_RDMA_WRITE == 0 && IBV_WR_SEND == 2 && IBV_WR_RDMA_READ == 4 && IBV_WR_ATOMIC_FETCH_AND_ADD == 6, "WR opcodes");
_Static_assert(IBV_SEND_FENCE == 1 && IBV_SEND_SIGNALED == 2 && IBV_SEND_SOLICITED == 4 && IBV_SEND_INLINE == 8, "send flags");
_Static_assert(IBV_WC_SUCCESS == 0 && IBV_WC_WR_FLUSH_ERR == 5 && IBV_WC_RNR_RETRY_EXC_ERR == 13 && IBV_WC_GENERAL_ERR == 21, "WC status");
_Static_assert(IBV_WC_RDMA_READ == 2 && IBV_WC_RECV == 128 && IBV_WC_RECV_RDMA_WITH_IMM == 129 && IBV_WC_WITH_IMM == 2, "WC opcodes");
_Static_assert(IBV_MTU_256 == 1 && IBV_MTU_4096 == 5 && IBV_PORT_ACTIVE == 4, "MTU and port state");

#endif

// Messages over UCX active messages (docs/transport.md, "Data paths"): receiving (eager and
// rendezvous, a rendezvous payload pulled into the Placer's memory or the caller's buffer),
// endpoint errors, and sending a message on either path (Send picks the connection's).
#include <ucp/api/ucp.h>

#include <cstring>

#include "transport/transport_impl.h"
#include "transport/wire.h"
#include "transport/wire_format.h"
#include "util/assert.h"

namespace ckpt::transport {

void TransportImpl::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<TransportImpl*>(arg);
  Conn* c = self->FindByEp(ep);
  if (c == nullptr) return;
  self->CloseConn(c->id, "the connection failed: " + UcsText(status), false);
}

// Every active message names the receiver's connection by the key it handed out in its
// handshake; one that does not decode, or names no open connection, is dropped unread (a
// rendezvous payload is never fetched).
ucs_status_t TransportImpl::OnAm(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<TransportImpl*>(arg);
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  WireHeader h;
  std::span<const uint8_t> body;
  Status st = DecodeWireHeader({static_cast<const uint8_t*>(header), header_length}, "a message",
                               &h, &body);
  Conn* c = nullptr;
  if (st.ok()) {
    auto it = self->by_key_.find(h.conn_key);
    if (it != self->by_key_.end() && it->second->state == ConnState::kOpen) c = it->second;
  }
  if (c == nullptr) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->stats_.dropped++;
    }
    self->LogHostile("dropped " +
                     (st.ok() ? std::string("a message for no open connection") : st.message()));
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  return self->HandleAm(c, h, body, data, length, rndv);
}

ucs_status_t TransportImpl::HandleAm(Conn* c, const WireHeader& h, std::span<const uint8_t> body,
                                     void* data, size_t length, bool rndv) {
  CKPTDB_ASSERT(c->state == ConnState::kOpen);
  if (length > options_.max_payload_bytes) {
    CloseConn(c->id,
              "sent a payload of " + std::to_string(length) + " bytes, more than the " +
                  std::to_string(options_.max_payload_bytes) + " allowed",
              false);
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_received += body.size() + length;
  }
  if (h.kind == Kind::kRequest) {
    if (c->requests_in >= options_.max_in_flight) {
      CloseConn(c->id, "exceeded " + std::to_string(options_.max_in_flight) + " requests in flight",
                false);
      return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    c->requests_in++;
    if (rndv) {
      pending_recvs_.push_back({c->id, data, length, h, {body.begin(), body.end()}, nullptr});
      return UCS_INPROGRESS;
    }
    const auto* p = static_cast<const uint8_t*>(data);
    Deliver(c->id, h, {body.begin(), body.end()}, std::vector<uint8_t>(p, p + length));
    return UCS_OK;
  }
  // A reply.
  std::shared_ptr<Call::State> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = c->calls.find(h.call_id);
    if (it != c->calls.end()) {
      call = it->second;
      c->calls.erase(it);
      c->calls_out--;
      deadlines_.erase(h.call_id);
    }
  }
  cv_.notify_all();
  if (call == nullptr) return rndv ? UCS_ERR_REJECTED : UCS_OK;  // a call given up on
  call->body.assign(body.begin(), body.end());
  if (length > 0 && (h.status != 0 || length > call->reply_capacity)) {
    call->Settle(h.status != 0 ? ReplyStatus(h, body)
                               : Status::Size("the reply from " + c->peer + " is " +
                                              std::to_string(length) + " bytes, more than the " +
                                              std::to_string(call->reply_capacity) +
                                              " the caller has room for"));
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  if (length > 0 && rndv) {
    {
      std::lock_guard<std::mutex> lock(call->mu);
      call->recv_busy = true;
    }
    PendingRecv pr{c->id, data, length, h, {}, call};
    pending_recvs_.push_back(std::move(pr));
    return UCS_INPROGRESS;
  }
  if (length > 0) std::memcpy(call->reply_buffer, data, length);
  call->payload_bytes = length;
  call->Settle(ReplyStatus(h, body));
  return UCS_OK;
}

Status TransportImpl::ReplyStatus(const WireHeader& h, std::span<const uint8_t> body) {
  if (h.status == 0) return Status::Ok();
  if (h.status > 0 || h.status < -64) {
    return Status::Corrupt("a reply with status " + std::to_string(h.status));
  }
  return Status::FromCode(h.status, std::string(body.begin(), body.end()));
}

void TransportImpl::StartPendingRecvs() {
  std::vector<PendingRecv> recvs;
  recvs.swap(pending_recvs_);
  for (PendingRecv& pr : recvs) {
    auto* ctx = new RecvCtx{this, pr.conn, pr.header, std::move(pr.body), {}, {}, pr.call};
    void* buffer = nullptr;
    if (pr.call != nullptr) {
      buffer = pr.call->reply_buffer;
    } else {
      if (options_.placer) ctx->placed = options_.placer(pr.header.type, ctx->body, pr.length);
      if (ctx->placed.data != nullptr) {
        buffer = ctx->placed.data;
      } else {
        ctx->payload.resize(pr.length);
        buffer = ctx->payload.data();
      }
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.recv_am = &TransportImpl::OnRecvDone;
    param.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, pr.desc, buffer, pr.length, &param);
    if (r == nullptr) {
      OnRecvDone(nullptr, UCS_OK, pr.length, ctx);
    } else if (UCS_PTR_IS_ERR(r)) {
      OnRecvDone(nullptr, UCS_PTR_STATUS(r), 0, ctx);
    }
  }
}

void TransportImpl::OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data) {
  std::unique_ptr<RecvCtx> ctx(static_cast<RecvCtx*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  TransportImpl* self = ctx->impl;
  if (ctx->call != nullptr) {
    {
      std::lock_guard<std::mutex> lock(ctx->call->mu);
      ctx->call->recv_busy = false;
    }
    if (status != UCS_OK) {
      ctx->call->Settle(Status::Peer("receiving a reply's payload failed: " + UcsText(status)));
    } else {
      ctx->call->payload_bytes = length;
      ctx->call->Settle(self->ReplyStatus(ctx->header, ctx->body));
    }
    ctx->call->UpdateReleased();
    return;
  }
  if (status != UCS_OK) {
    self->CloseConn(ctx->conn, "receiving a request's payload failed: " + UcsText(status), false);
    return;
  }
  self->Deliver(ctx->conn, ctx->header, std::move(ctx->body), std::move(ctx->payload),
                std::move(ctx->placed), length);
}

void TransportImpl::Send(Conn* c, Kind kind, uint16_t type, uint64_t call_id, int32_t status,
                         std::span<const uint8_t> body, const void* payload, size_t payload_bytes,
                         std::shared_ptr<const void> keep, std::shared_ptr<Call::State> call,
                         int file_fd, uint64_t file_offset) {
  CKPTDB_ASSERT(c->state == ConnState::kOpen);
  CKPTDB_ASSERT((c->path == DataPath::kUcx) == (c->ep != nullptr));
  WireWriter w;
  WireHeader h;
  h.kind = kind;
  h.type = type;
  h.conn_key = c->peer_key;
  h.call_id = call_id;
  h.status = status;
  h.body_bytes = static_cast<uint32_t>(body.size());
  EncodeWireHeader(h, &w);
  const bool socket = c->path == DataPath::kSocket;
  if (socket) w.U64(payload_bytes);  // the socket path's prefix: the payload's length
  w.Raw(body.data(), body.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += body.size() + payload_bytes;
  }
  if (socket) {
    OutMsg m;
    m.head = w.Take();
    m.payload = static_cast<const uint8_t*>(payload);
    m.payload_bytes = payload_bytes;
    m.keep = std::move(keep);
    m.call = std::move(call);
    m.file_fd = payload_bytes > 0 ? file_fd : -1;
    m.file_offset = file_offset;
    c->sendq.push_back(std::move(m));
    if (!c->want_out) FlushSock(c);  // else the socket is full: EPOLLOUT resumes the queue
    return;
  }
  auto* ctx = new SendCtx;
  ctx->impl = this;
  ctx->conn = c->id;
  ctx->keep = std::move(keep);
  ctx->call = std::move(call);
  ctx->header = w.Take();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &TransportImpl::OnSendDone;
  param.user_data = ctx;
  ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, kAmId, ctx->header.data(), ctx->header.size(),
                                       payload, payload_bytes, &param);
  if (r == nullptr) {
    OnSendDone(nullptr, UCS_OK, ctx);
  } else if (UCS_PTR_IS_ERR(r)) {
    OnSendDone(nullptr, UCS_PTR_STATUS(r), ctx);
  }
}

void TransportImpl::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendCtx> ctx(static_cast<SendCtx*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  if (ctx->call != nullptr) {
    {
      std::lock_guard<std::mutex> lock(ctx->call->mu);
      ctx->call->send_done = true;
    }
    if (status != UCS_OK) {
      ctx->call->Settle(Status::Peer("sending to " + ctx->impl->PeerName(ctx->conn) +
                                     " failed: " + UcsText(status)));
    }
    ctx->call->UpdateReleased();
  }
}

}  // namespace ckpt::transport

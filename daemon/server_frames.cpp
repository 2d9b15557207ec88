// One request frame on a connection (see server.h): decoded strictly (a frame or body
// that does not decode closes the connection), handed to its Park verb, and its
// answer encoded and sent; WAIT may be answered later, through Park's reply sink.
#include <cstring>

#include "daemon/server.h"
#include "proto/wire.h"

namespace kvpark::daemon {

bool Server::handle_frame(ConnectionId id, std::span<const uint8_t> message) {
  wire::FrameHeader header;
  std::span<const uint8_t> body;
  if (wire::decode_header(message, header, body) != Status::Ok) return false;
  if ((header.verb & wire::reply_bit) != 0 || header.status != 0) return false;
  const auto verb = static_cast<wire::Verb>(header.verb);
  const uint16_t reply_verb = header.verb | wire::reply_bit;
  const uint32_t seq = header.sequence;
  std::vector<uint8_t> out;
  bool with_fd = false;
  Status status = Status::Ok;
  // Each case decodes strictly; a body that does not decode closes the connection.
  switch (verb) {
    case wire::Verb::Hello: {
      wire::HelloRequest req;
      wire::HelloReply rep;
      if (wire::decode(body, req) != Status::Ok) return false;
      status = park_.hello(id, req, rep);
      if (status == Status::Ok) {
        wire::encode(rep, seq, out);
        with_fd = true;
        connections_.at(id).greeted = true;
      }
      break;
    }
    case wire::Verb::Lookup: {
      wire::LookupRequest req;
      wire::LookupReply rep;
      if (wire::decode(body, req) != Status::Ok) return false;
      status = park_.lookup(id, req, rep);
      if (status == Status::Ok) wire::encode(rep, seq, out);
      break;
    }
    case wire::Verb::Wait: {
      wire::WaitRequest req;
      wire::LookupReply rep;
      if (wire::decode(body, req) != Status::Ok) return false;
      if (!park_.wait(id, seq, req, status, rep)) return true;  // answered later
      if (status == Status::Ok || status == Status::Timeout) {
        // A timed-out WAIT still describes what is ready.
        wire::encode(wire::Verb::Wait, rep, seq, out);
        const auto code = static_cast<uint16_t>(status);
        std::memcpy(out.data() + 2, &code, sizeof code);
      }
      break;
    }
    case wire::Verb::ReleaseOneWay: {
      wire::ReleaseRequest req;
      if (wire::decode(body, req) != Status::Ok) return false;
      (void)park_.release(id, req);  // nobody listens for the answer
      return true;
    }
    case wire::Verb::ReportCorrupt: {
      wire::CorruptReport req;
      if (wire::decode(body, req) != Status::Ok) return false;
      park_.report_corrupt(id, req);  // one way
      return true;
    }
    case wire::Verb::Release: {
      wire::ReleaseRequest req;
      if (wire::decode(body, req) != Status::Ok) return false;
      status = park_.release(id, req);
      break;
    }
    case wire::Verb::ReserveBlocks: {
      wire::ReserveBlocksRequest req;
      wire::ReserveBlocksReply rep;
      if (wire::decode(body, req) != Status::Ok) return false;
      status = park_.reserve_blocks(id, req, rep);
      if (status == Status::Ok) wire::encode(rep, seq, out);
      break;
    }
    case wire::Verb::ReserveSnapshot: {
      wire::ReserveSnapshotRequest req;
      wire::ReserveSnapshotReply rep;
      if (wire::decode(body, req) != Status::Ok) return false;
      status = park_.reserve_snapshot(id, req, rep);
      if (status == Status::Ok) wire::encode(rep, seq, out);
      break;
    }
    case wire::Verb::Seal:
    case wire::Verb::Abort: {
      wire::ReservationRequest req;
      if (wire::decode(body, req) != Status::Ok) return false;
      status = verb == wire::Verb::Seal ? park_.seal(id, req) : park_.abort(id, req);
      break;
    }
    case wire::Verb::Stats: {
      if (!body.empty()) return false;
      wire::encode(park_.stats(), seq, out);
      break;
    }
  }
  if (out.empty()) wire::encode(reply_verb, static_cast<uint16_t>(status), seq, out);
  send_reply(id, out, with_fd);  // on failure the connection closes after this frame
  return true;
}

}  // namespace kvpark::daemon

// Verifying an upstream before it is served cached: the slot-file round trip.
//
// What can be misconfigured without any endpoint saying so: llama-server started
// without --slot-save-path, or with another directory than the proxy's --slot-dir,
// or unable to read the files the proxy writes there. The round trip catches each:
// llama-server prefills a few tokens into a slot and saves it twice (two lengths,
// which also teach SlotFileSizes the file size per token), the proxy finds both
// files in its slot directory, writes a copy of the second under a name of its own
// and has llama-server restore it. Every message names the upstream and what to fix.
//
// The same two files are the block self-check (state_blocks.h): when they split and
// write again byte for byte, the file restored is the 1-token prefix written from the
// 2-token file's cells, so llama-server itself accepts a recomposed prefix before any
// state is parked as blocks. Anything else parks slot files whole, with the reason.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "proxy/route.h"

namespace kvpark::proxy {
namespace {

constexpr const char* probe_text = "kvpark slot check";
constexpr uint32_t probe_tokens[2] = {1, 2};  // the two lengths saved
constexpr int http_not_implemented = 501;    // llama-server: "Start it with --slot-save-path"
// A misconfigured upstream is checked again at most this often (each check
// prefills a token into one of its slots); one that was away, at once.
constexpr auto misconfigured_retry_interval = std::chrono::seconds(5);

bool read_file(const std::string& path, std::string* ret_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream out;
  out << in.rdbuf();
  *ret_bytes = out.str();
  return bool(in) || in.eof();
}

bool write_file(const std::string& path, const std::string& bytes, std::string* ret_error) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    *ret_error = std::strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  const int saved = errno;
  close(fd);
  if (done == bytes.size()) return true;
  *ret_error = std::strerror(saved);
  return false;
}

}  // namespace

bool Route::round_trip(uint32_t slot, std::string* ret_why) {
  const std::string who = upstream_.describe();
  const std::string slot_text = "slot " + std::to_string(slot);
  std::vector<int32_t> tokens;
  std::string error;
  if (!upstream_.tokenize(probe_text, &tokens, &error) || tokens.empty()) {
    *ret_why = who + " cannot tokenize: " + error;
    return false;
  }
  while (tokens.size() < probe_tokens[1]) tokens.push_back(tokens.back());
  const std::string saved_name = slot_file_name(slot, "check");
  const std::string restore_name = slot_file_name(slot, "check-restore");
  const std::string saved_path = slot_file_path(saved_name);
  const std::string restore_path = slot_file_path(restore_name);
  uint64_t bytes[2] = {0, 0};
  uint32_t saved_tokens[2] = {0, 0};
  std::string first_file;  // the 1-token file, before the second save replaces it
  bool ok = true;
  for (int i = 0; ok && i < 2; ++i) {
    uint32_t prefilled = 0;
    double prefill_msec = 0;  // probes are too short to say the upstream's rate
    if (!upstream_.prefill(slot, tokens, probe_tokens[i], &prefilled, &prefill_msec, &error)) {
      *ret_why = who + " cannot prefill " + slot_text + ": " + error;
      ok = false;
      break;
    }
    int status = 0;
    if (!upstream_.save_slot(slot, saved_name, &saved_tokens[i], &error, &status)) {
      *ret_why = status == http_not_implemented
                     ? who + " was started without --slot-save-path: start it with "
                             "--slot-save-path " + slot_dir_ + "/ (the proxy's --slot-dir)"
                     : who + " cannot save " + slot_text + " (" + error +
                           "): does its --slot-save-path exist, writable by it?";
      ok = false;
      break;
    }
    struct stat st;
    if (stat(saved_path.c_str(), &st) != 0) {
      *ret_why = who + " saves slot files outside the proxy's --slot-dir " + slot_dir_ +
                 " (no " + saved_name + " there): start it with --slot-save-path " + slot_dir_ +
                 "/, or give the proxy --slot-dir set to its --slot-save-path";
      ok = false;
      break;
    }
    bytes[i] = uint64_t(st.st_size);
    if (i == 0 && !read_file(saved_path, &first_file)) break;  // said below
  }
  std::string file;
  if (ok && (!read_file(saved_path, &file) || first_file.size() != bytes[0])) {
    *ret_why = "the proxy cannot read " + saved_path + ", which " + who +
               " saved: give the proxy read access to its slot files (same group, mode g+r)";
    ok = false;
  }
  std::shared_ptr<const BlockShape> shape;
  std::string whole_why;
  std::vector<uint8_t> prefix;
  if (ok && !park_blocks_) {
    whole_why = "--park-as whole";
  } else if (ok) {
    auto span_of = [](const std::string& f) {
      return std::span(reinterpret_cast<const uint8_t*>(f.data()), f.size());
    };
    if (!learn_block_shape(span_of(first_file), span_of(file), base_namespace(), &shape, &prefix,
                           &whole_why))
      shape.reset();
  }
  // The recomposed prefix first, when there is one, twice (a busy or slow upstream fails
  // a restore now and then: once parked whole, an upstream stays so until its namespace
  // changes); the copy if llama-server refuses it.
  constexpr int recomposed_attempts = 2;
  for (int attempt = shape != nullptr ? 0 : recomposed_attempts;
       ok && attempt <= recomposed_attempts; ++attempt) {
    const bool recomposed = attempt < recomposed_attempts;
    const std::string content =
        recomposed ? std::string(prefix.begin(), prefix.end()) : file;
    const uint32_t expected = recomposed ? 1 : saved_tokens[1];
    if (!write_file(restore_path, content, &error)) {
      *ret_why = "the proxy cannot write slot files in " + slot_dir_ + " (" + error +
                 "): give it write access there";
      ok = false;
      break;
    }
    uint32_t restored = 0;
    bool refused = false;
    if (upstream_.restore_slot(slot, restore_name, &restored, &error, &refused) &&
        restored == expected)
      break;
    if (recomposed) {
      shape.reset();
      whole_why = "slot files not split: " + who + " did not restore a recomposed prefix (" +
                  (error.empty() ? std::to_string(restored) + " tokens restored" : error) + ")";
      continue;
    }
    *ret_why = who + " cannot restore a slot file the proxy wrote in " + slot_dir_ + " (" +
               (error.empty() ? std::to_string(restored) + " tokens restored" : error) +
               "): let it read files the proxy writes there (same group, mode g+r)";
    ok = false;
  }
  unlink(saved_path.c_str());
  unlink(restore_path.c_str());
  if (!ok) return false;
  sizes_.observe(saved_tokens[0], bytes[0]);
  sizes_.observe(saved_tokens[1], bytes[1]);
  learned_shape(std::move(shape), whole_why);
  return true;
}

kvpark_hash128 Route::base_namespace() const {
  std::lock_guard lock(mutex_);
  return namespace_id_;
}

void Route::learned_shape(std::shared_ptr<const BlockShape> shape, const std::string& whole_why) {
  {
    std::lock_guard lock(mutex_);
    if (shape != nullptr) {  // in the namespace as it is now: an epoch may have moved on
      auto now = std::make_shared<BlockShape>(*shape);
      now->space = block_namespace(namespace_id_, now->layout, now->block_tokens);
      shape = std::move(now);
    }
    const bool unchanged =
        shape == nullptr ? block_shape_ == nullptr && whole_why == whole_why_
                         : block_shape_ != nullptr && shape->space.low == block_shape_->space.low &&
                               shape->space.high == block_shape_->space.high;
    block_shape_ = std::move(shape);
    whole_why_ = whole_why;
    if (unchanged) return;
  }
  tell_parking();  // now: the slot files saved from here on have this layout
  std::fprintf(stderr, "kvpark-proxy: upstream %s: slot files parked %s\n", name().c_str(),
               parking_mode() == "blocks"
                   ? "as blocks (a shared head is parked once; any block-aligned prefix restores)"
                   : parking_mode().c_str());
}

void Route::slot_layout_changed(kvpark_hash128 checked_space) {
  // Not while a round trip runs: it may be learning the new layout now.
  std::lock_guard verifying(verify_mutex_);
  {
    std::lock_guard lock(mutex_);
    if (block_shape_ == nullptr || block_shape_->space.low != checked_space.low ||
        block_shape_->space.high != checked_space.high)
      return;  // a shape learned since stands
    block_shape_.reset();
    whole_why_ = "a slot file's layout changed: checking again";
    verified_ = false;
  }
  tell_parking();
  set_state(UpstreamState::verifying, upstream_.describe() +
                                          " saved a slot file of another layout (restarted with "
                                          "other cache settings?): checking its slot files again");
}

void Route::verify() {
  std::lock_guard verifying(verify_mutex_);
  if (verified_) return;
  const auto now = std::chrono::steady_clock::now();
  if (state() == UpstreamState::misconfigured && now < last_verify_ + misconfigured_retry_interval)
    return;
  last_verify_ = now;
  const uint32_t slot = slots_.try_acquire_idle();
  if (slot == no_slot) {
    set_state(UpstreamState::verifying, "waiting for an idle slot to check slot files with");
    return;
  }
  std::string why;
  const bool ok = round_trip(slot, &why);
  slots_.release(slot, {});
  if (!ok) {
    set_state(UpstreamState::misconfigured, why);
    return;
  }
  verified_ = true;
}

bool Route::recheck_with_slot(uint32_t slot) {
  std::lock_guard verifying(verify_mutex_);
  std::string why;
  if (round_trip(slot, &why)) return true;
  verified_ = false;
  set_state(UpstreamState::misconfigured, why);  // the watcher verifies it again
  return false;
}

}  // namespace kvpark::proxy

// device_host_test.cpp — the device API's host path against a real kvparkd (suite 'integration').
//
// One client parks blocks gathered from a host paged cache through kvpark_device_park; another
// client restores them through kvpark_device_restore into a different, scattered page table.
// Each check compares the whole destination cache with a TestCache of the same seed to which
// the expected per-element copy was applied, so every byte in the range must match and every
// byte outside it must be untouched; parked payloads are compared with the reference image.
#include <gtest/gtest.h>

#include <memory>
#include <tuple>

#include "device_test_util.h"
#include "tests/testing/daemon_process.h"

namespace kvpark::device_testing {
namespace {

using kernels::testing::scattered_page_table;
using testing::DaemonProcess;

struct Closer {
  void operator()(kvpark_client* c) const { kvpark_disconnect(c); }
  void operator()(kvpark_device* d) const { kvpark_device_detach(d); }
  void operator()(kvpark_plan* p) const { kvpark_plan_release(p); }
  void operator()(kvpark_transfer* t) const { kvpark_transfer_free(t); }
};
using Client = std::unique_ptr<kvpark_client, Closer>;
using Device = std::unique_ptr<kvpark_device, Closer>;
using Plan = std::unique_ptr<kvpark_plan, Closer>;
using Transfer = std::unique_ptr<kvpark_transfer, Closer>;

kvpark_publish_options publish_options() {
  return {1, KVPARK_CLASS_SHARED, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
}

// A client and a device on one host cache.
struct Engine {
  Engine(const DaemonProcess& daemon, const KvCacheGeometry& g, uint32_t seed)
      : cache(g, seed), pages(scattered_page_table(pages_for(prompt_tokens), g.pages_total, seed)) {
    const kvpark_namespace ns = block_namespace(7, g);
    kvpark_client* c = nullptr;
    status = kvpark_connect(daemon.socket_path().c_str(), &ns, &c);
    if (status != KVPARK_OK) return;
    client.reset(c);
    const kvpark_kv_cache kv = host_cache(cache);
    kvpark_device* d = nullptr;
    status = kvpark_device_attach(client.get(), &kv, nullptr, &d);
    if (status == KVPARK_OK) device.reset(d);
  }
  TestCache cache;
  std::vector<int32_t> pages;
  kvpark_status status = KVPARK_OK;
  Client client;  // declared before device: the device detaches first
  Device device;
};

// Parks blocks [first_block, first_block + count) of `tokens` from `e`; returns blocks written.
size_t park(Engine& e, const std::vector<int32_t>& tokens, size_t first_block, size_t count) {
  const kvpark_publish_options options = publish_options();
  kvpark_reservation* r = nullptr;
  EXPECT_EQ(kvpark_reserve_blocks(e.client.get(), &options, tokens.data(), tokens.size(),
                                  first_block, count, &r),
            KVPARK_OK);
  if (r == nullptr) return 0;
  size_t written = 0;
  for (size_t i = 0; i < count; ++i) written += kvpark_reservation_block(r, i) != nullptr;
  kvpark_transfer* t = nullptr;
  EXPECT_EQ(kvpark_device_park(e.device.get(), r, e.pages.data(), e.pages.size(),
                               first_block * block_tokens,
                               static_cast<uint32_t>(count * block_tokens), &t),
            KVPARK_OK);
  EXPECT_EQ(kvpark_transfer_wait(t, 10'000), KVPARK_OK);
  kvpark_transfer_free(t);
  EXPECT_EQ(kvpark_seal(r), KVPARK_OK);
  return written;
}

Plan lookup(Engine& e, const std::vector<int32_t>& tokens) {
  kvpark_plan* p = nullptr;
  EXPECT_EQ(kvpark_lookup(e.client.get(), 2, tokens.data(), tokens.size(), &p), KVPARK_OK);
  return Plan(p);
}

kvpark_status restore(Engine& e, const kvpark_plan* plan, uint64_t first, uint32_t n,
                      uint32_t layer_first = 0, uint32_t layer_count = 0, uint32_t flags = 0) {
  kvpark_transfer* t = nullptr;
  const kvpark_status s =
      kvpark_device_restore(e.device.get(), plan, e.pages.data(), e.pages.size(), first, n,
                            layer_first, layer_count, flags, &t);
  if (s != KVPARK_OK) return s;
  const kvpark_status w = kvpark_transfer_wait(t, 10'000);
  kvpark_transfer_free(t);
  return w;
}

class DeviceRoundTrip : public ::testing::TestWithParam<std::tuple<KvLayout, KvFusion, uint32_t>> {
};

TEST_P(DeviceRoundTrip, RestoresEveryParkedByteIntoAnotherPageTable) {
  const auto [layout, fusion, elem_bytes] = GetParam();
  const KvCacheGeometry g = geometry(layout, fusion, elem_bytes);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  Engine writer(daemon, g, 11);
  ASSERT_EQ(writer.status, KVPARK_OK);
  const std::vector<int32_t> tokens = prompt(3);
  ASSERT_EQ(park(writer, tokens, 0, blocks), blocks);

  Engine reader(daemon, g, 12);
  ASSERT_EQ(reader.status, KVPARK_OK);
  ASSERT_NE(reader.pages, writer.pages);
  Plan plan = lookup(reader, tokens);
  ASSERT_EQ(kvpark_plan_block_count(plan.get()), blocks);
  // The parked payload is the documented block image, not merely something restore undoes.
  for (uint32_t b = 0; b < blocks; ++b) {
    const std::vector<uint8_t> want = reference_image(writer.cache, writer.pages, b);
    ASSERT_EQ(std::memcmp(kvpark_plan_block(plan.get(), b), want.data(), want.size()), 0)
        << "block " << b;
  }
  ASSERT_EQ(restore(reader, plan.get(), 0, blocks * block_tokens), KVPARK_OK);

  TestCache expected(g, 12);
  copy_reference(writer.cache, writer.pages, expected, reader.pages, 0, blocks * block_tokens);
  EXPECT_EQ(reader.cache.snapshot(), expected.snapshot());
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeviceRoundTrip,
                         ::testing::Combine(::testing::Values(KvLayout::nhd, KvLayout::hnd),
                                            ::testing::Values(KvFusion::separate, KvFusion::fused),
                                            ::testing::Values(1u, 2u, 4u)),
                         [](const auto& case_info) {
                           return kernels::testing::geometry_name(std::get<0>(case_info.param),
                                                                  std::get<1>(case_info.param),
                                                                  std::get<2>(case_info.param));
                         });

TEST(DeviceRestore, MovesOnlyTheRequestedBlocksAndLayers) {
  const KvCacheGeometry g = geometry(KvLayout::hnd, KvFusion::separate);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  Engine writer(daemon, g, 21);
  Engine reader(daemon, g, 22);
  ASSERT_EQ(writer.status, KVPARK_OK);
  ASSERT_EQ(reader.status, KVPARK_OK);
  const std::vector<int32_t> tokens = prompt(4);
  ASSERT_EQ(park(writer, tokens, 0, blocks), blocks);
  Plan plan = lookup(reader, tokens);
  ASSERT_EQ(kvpark_plan_block_count(plan.get()), blocks);

  ASSERT_EQ(restore(reader, plan.get(), block_tokens, 2 * block_tokens, 1, 1), KVPARK_OK);
  TestCache expected(g, 22);
  copy_reference(writer.cache, writer.pages, expected, reader.pages, block_tokens, 2 * block_tokens,
                 1, 2);
  EXPECT_EQ(reader.cache.snapshot(), expected.snapshot());
}

TEST(DeviceRestore, LayerwiseSignalsEachLayerAfterItsBytesLand) {
  // Enough bytes per layer that a layer signalled before its copy would be caught.
  KvCacheGeometry g = geometry(KvLayout::nhd, KvFusion::separate, 4, 8, 8, 128);
  g.pages_total = 64;
  DaemonProcess daemon(testing::DaemonConfig{.arena_bytes = 256ull << 20});
  ASSERT_TRUE(daemon.start());
  Engine writer(daemon, g, 31);
  Engine reader(daemon, g, 32);
  ASSERT_EQ(writer.status, KVPARK_OK);
  ASSERT_EQ(reader.status, KVPARK_OK);
  const std::vector<int32_t> tokens = prompt(5);
  ASSERT_EQ(park(writer, tokens, 0, blocks), blocks);
  Plan plan = lookup(reader, tokens);
  ASSERT_EQ(kvpark_plan_block_count(plan.get()), blocks);
  TestCache expected(g, 32);
  copy_reference(writer.cache, writer.pages, expected, reader.pages, 0, blocks * block_tokens);

  kvpark_transfer* raw = nullptr;
  ASSERT_EQ(kvpark_device_restore(reader.device.get(), plan.get(), reader.pages.data(),
                                  reader.pages.size(), 0, blocks * block_tokens, 0, 0,
                                  KVPARK_TRANSFER_LAYERWISE, &raw),
            KVPARK_OK);
  Transfer t(raw);
  EXPECT_EQ(kvpark_transfer_wait_layer(t.get(), g.layers, 0), KVPARK_INVALID_ARGUMENT);
  for (uint32_t l = 0; l < g.layers; ++l) {
    ASSERT_EQ(kvpark_transfer_wait_layer(t.get(), l, 10'000), KVPARK_OK) << "layer " << l;
    // First, at once, the last row a layer's copy writes (V of the last token), so that a
    // layer signalled before its copy finished is caught before the copy can catch up.
    const uint64_t last = blocks * block_tokens - 1;
    const auto page = static_cast<uint32_t>(reader.pages[last / g.page_tokens]);
    const auto slot = static_cast<uint32_t>(last % g.page_tokens);
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      ASSERT_EQ(std::memcmp(reader.cache.element(l, 1, page, slot, h, 0),
                            expected.element(l, 1, page, slot, h, 0), g.head_dim * g.elem_bytes),
                0)
          << "layer " << l << " head " << h;
    }
    // Then the whole layer, while later layers may still be arriving.
    ASSERT_EQ(layer_bytes(reader.cache, l), layer_bytes(expected, l)) << "layer " << l;
  }
  EXPECT_EQ(kvpark_transfer_wait(t.get(), 10'000), KVPARK_OK);
  EXPECT_EQ(kvpark_transfer_poll(t.get()), KVPARK_OK);
  EXPECT_EQ(kvpark_transfer_event(t.get(), 0), nullptr);  // host path: no CUDA event
  EXPECT_EQ(reader.cache.snapshot(), expected.snapshot());
}

TEST(DevicePark, SkipsBlocksAlreadyParked) {
  const KvCacheGeometry g = geometry(KvLayout::nhd, KvFusion::fused);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  Engine first(daemon, g, 41);
  Engine second(daemon, g, 42);  // same tokens, different bytes in its cache
  Engine reader(daemon, g, 43);
  ASSERT_EQ(first.status, KVPARK_OK);
  ASSERT_EQ(second.status, KVPARK_OK);
  ASSERT_EQ(reader.status, KVPARK_OK);
  const std::vector<int32_t> tokens = prompt(6);
  ASSERT_EQ(park(first, tokens, 0, 1), 1u);
  ASSERT_EQ(park(first, tokens, 3, 1), 1u);        // a hole at blocks 1..2
  ASSERT_EQ(park(second, tokens, 0, blocks), 3u);  // writes blocks 1, 2, 4 only
  Plan plan = lookup(reader, tokens);
  ASSERT_EQ(kvpark_plan_block_count(plan.get()), blocks);
  ASSERT_EQ(restore(reader, plan.get(), 0, blocks * block_tokens), KVPARK_OK);

  TestCache expected(g, 43);
  for (uint32_t b = 0; b < blocks; ++b) {
    Engine& source = (b == 0 || b == 3) ? first : second;
    copy_reference(source.cache, source.pages, expected, reader.pages, b * block_tokens,
                   block_tokens);
  }
  EXPECT_EQ(reader.cache.snapshot(), expected.snapshot());
}

TEST(DeviceAttach, RefusesACacheThatDoesNotMatchTheNamespace) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  const KvCacheGeometry g = geometry(KvLayout::nhd, KvFusion::separate);
  const kvpark_namespace ns = block_namespace(8, g);
  kvpark_client* raw = nullptr;
  ASSERT_EQ(kvpark_connect(daemon.socket_path().c_str(), &ns, &raw), KVPARK_OK);
  Client client(raw);
  kvpark_device* d = nullptr;

  TestCache matching(g, 1);  // attaches: the control for the refusals below
  kvpark_kv_cache kv = host_cache(matching);
  ASSERT_EQ(kvpark_device_attach(client.get(), &kv, nullptr, &d), KVPARK_OK);
  kvpark_device_detach(d);

  TestCache more_heads(geometry(KvLayout::nhd, KvFusion::separate, 2, 3, 4), 1);
  kv = host_cache(more_heads);
  EXPECT_EQ(kvpark_device_attach(client.get(), &kv, nullptr, &d), KVPARK_GEOMETRY_MISMATCH);
  TestCache wider(geometry(KvLayout::nhd, KvFusion::separate, 4), 1);
  kv = host_cache(wider);
  EXPECT_EQ(kvpark_device_attach(client.get(), &kv, nullptr, &d), KVPARK_GEOMETRY_MISMATCH);

  kv = host_cache(matching);
  int stream = 0;
  EXPECT_EQ(kvpark_device_attach(client.get(), &kv, &stream, &d), KVPARK_INVALID_ARGUMENT);
  kv.elem_bytes = 3;
  EXPECT_EQ(kvpark_device_attach(client.get(), &kv, nullptr, &d), KVPARK_INVALID_ARGUMENT);
  kv = host_cache(matching);
  kv.v = nullptr;  // separate K/V without V
  EXPECT_EQ(kvpark_device_attach(client.get(), &kv, nullptr, &d), KVPARK_INVALID_ARGUMENT);

  kvpark_namespace snapshot_only = ns;
  snapshot_only.id.low = 9;
  snapshot_only.block_tokens = 0;
  snapshot_only.block_payload_bytes = 0;
  snapshot_only.snapshot_required = 1;
  ASSERT_EQ(kvpark_connect(daemon.socket_path().c_str(), &snapshot_only, &raw), KVPARK_OK);
  Client snapshot_client(raw);
  kv = host_cache(matching);
  EXPECT_EQ(kvpark_device_attach(snapshot_client.get(), &kv, nullptr, &d), KVPARK_INVALID_ARGUMENT);

  kv.memory = KVPARK_MEMORY_CUDA;
  if (!kvpark_device_cuda_built()) {
    EXPECT_EQ(kvpark_device_attach(client.get(), &kv, nullptr, &d), KVPARK_UNAVAILABLE);
  }
}

TEST(DeviceRestore, RefusesBadRangesBeforeMovingAnything) {
  const KvCacheGeometry g = geometry(KvLayout::nhd, KvFusion::separate);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  Engine writer(daemon, g, 51);
  Engine reader(daemon, g, 52);
  ASSERT_EQ(writer.status, KVPARK_OK);
  ASSERT_EQ(reader.status, KVPARK_OK);
  const std::vector<int32_t> tokens = prompt(7);
  ASSERT_EQ(park(writer, tokens, 0, 2), 2u);
  Plan plan = lookup(reader, tokens);
  ASSERT_EQ(kvpark_plan_block_count(plan.get()), 2u);
  const auto before = reader.cache.snapshot();

  EXPECT_EQ(restore(reader, plan.get(), 0, 3 * block_tokens), KVPARK_INVALID_ARGUMENT);  // > plan
  EXPECT_EQ(restore(reader, plan.get(), 0, block_tokens + 1), KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(restore(reader, plan.get(), 1, block_tokens), KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(restore(reader, plan.get(), 0, 0), KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(restore(reader, plan.get(), 0, block_tokens, g.layers, 1), KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(restore(reader, plan.get(), 0, block_tokens, 1, g.layers), KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(restore(reader, plan.get(), 0, block_tokens, 0, 0, 0x80), KVPARK_INVALID_ARGUMENT);
  kvpark_transfer* t = nullptr;
  EXPECT_EQ(
      kvpark_device_restore(reader.device.get(), plan.get(), reader.pages.data(),
                            pages_for(2 * block_tokens) - 1, 0, 2 * block_tokens, 0, 0, 0, &t),
      KVPARK_INVALID_ARGUMENT);  // page table too short
  std::vector<int32_t> bad_pages = reader.pages;
  bad_pages[2] = static_cast<int32_t>(g.pages_total);
  EXPECT_EQ(kvpark_device_restore(reader.device.get(), plan.get(), bad_pages.data(),
                                  bad_pages.size(), 0, 2 * block_tokens, 0, 0, 0, &t),
            KVPARK_INVALID_ARGUMENT);
  bad_pages[2] = -1;
  EXPECT_EQ(kvpark_device_restore(reader.device.get(), plan.get(), bad_pages.data(),
                                  bad_pages.size(), 0, 2 * block_tokens, 0, 0, 0, &t),
            KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(t, nullptr);
  EXPECT_EQ(reader.cache.snapshot(), before);
  // The same calls with a valid range go through (the refusals were for the range alone).
  EXPECT_EQ(restore(reader, plan.get(), 0, 2 * block_tokens), KVPARK_OK);
  EXPECT_NE(reader.cache.snapshot(), before);
}

TEST(DeviceTransfer, ManyQueuedTransfersCompleteInOrderAndFreeWaits) {
  const KvCacheGeometry g = geometry(KvLayout::hnd, KvFusion::fused);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  Engine writer(daemon, g, 61);
  Engine reader(daemon, g, 62);
  ASSERT_EQ(writer.status, KVPARK_OK);
  ASSERT_EQ(reader.status, KVPARK_OK);
  const std::vector<int32_t> tokens = prompt(8);
  ASSERT_EQ(park(writer, tokens, 0, blocks), blocks);
  Plan plan = lookup(reader, tokens);
  std::vector<kvpark_transfer*> queued(blocks, nullptr);
  for (uint32_t b = 0; b < blocks; ++b) {
    ASSERT_EQ(kvpark_device_restore(reader.device.get(), plan.get(), reader.pages.data(),
                                    reader.pages.size(), b * block_tokens, block_tokens, 0, 0,
                                    b % 2 == 0 ? KVPARK_TRANSFER_LAYERWISE : 0, &queued[b]),
              KVPARK_OK);
  }
  // The last one completes after every earlier one (one worker, submission order).
  ASSERT_EQ(kvpark_transfer_wait(queued.back(), 10'000), KVPARK_OK);
  for (kvpark_transfer* t : queued) EXPECT_EQ(kvpark_transfer_poll(t), KVPARK_OK);
  for (kvpark_transfer* t : queued) kvpark_transfer_free(t);
  TestCache expected(g, 62);
  copy_reference(writer.cache, writer.pages, expected, reader.pages, 0, blocks * block_tokens);
  EXPECT_EQ(reader.cache.snapshot(), expected.snapshot());
}

}  // namespace
}  // namespace kvpark::device_testing

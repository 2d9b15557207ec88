// device_cuda_test.cpp — the device API's CUDA path against a real kvparkd (suite 'gpu').
//
// The host round trip of device_host_test.cpp with device-resident caches: one client parks
// from a CUDA paged cache through the registered arena, another restores (layer by layer)
// into a different page table on its own stream; the downloaded cache must equal the
// per-element expectation. A daemon restart gives a new arena mapping, which must be
// registered afresh. Every test skips with the reason when no device is usable; the program
// then exits 77.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <tuple>

#include "device_test_util.h"
#include "kvpark_kernels_cuda.h"
#include "tests/testing/daemon_process.h"

namespace kvpark::device_testing {
namespace {

using kernels::testing::scattered_page_table;
using testing::DaemonProcess;

bool have_device(std::string* ret_reason) {
  int count = 0;
  int error = 0;
  if (kernels::cuda_device_count(&count, &error) == kernels::KernelStatus::ok) return true;
  *ret_reason = error != 0 ? cudaGetErrorString(static_cast<cudaError_t>(error))
                           : "cudaGetDeviceCount returned 0";
  return false;
}

#define SKIP_WITHOUT_GPU()                           \
  do {                                               \
    std::string reason_;                             \
    if (!have_device(&reason_)) {                    \
      GTEST_SKIP() << "no CUDA device: " << reason_; \
    }                                                \
  } while (0)

// A host TestCache mirrored in device memory, with a client and a device on a stream.
struct CudaEngine {
  CudaEngine(const DaemonProcess& daemon, const KvCacheGeometry& g, uint32_t seed)
      : host(g, seed), pages(scattered_page_table(pages_for(prompt_tokens), g.pages_total, seed)) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    for (auto& t : host.k_tensors()) k.push_back(upload(t));
    for (auto& t : host.v_tensors()) v.push_back(upload(t));
    connect(daemon);
  }
  ~CudaEngine() {
    kvpark_device_detach(device);
    kvpark_disconnect(client);
    for (void* p : k) cudaFree(p);
    for (void* p : v) cudaFree(p);
    cudaStreamDestroy(stream);
  }
  void connect(const DaemonProcess& daemon) {
    kvpark_device_detach(device);
    kvpark_disconnect(client);
    device = nullptr;
    client = nullptr;
    const kvpark_namespace ns = block_namespace(7, host.geometry());
    status = kvpark_connect(daemon.socket_path().c_str(), &ns, &client);
    if (status != KVPARK_OK) return;
    const kvpark_kv_cache kv =
        kv_cache(host.geometry(), k.data(), v.empty() ? nullptr : v.data(), KVPARK_MEMORY_CUDA);
    status = kvpark_device_attach(client, &kv, stream, &device);
  }
  void* upload(const std::vector<uint8_t>& bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  }
  void download() {
    for (size_t i = 0; i < k.size(); ++i) {
      EXPECT_EQ(cudaMemcpy(host.k_tensors()[i].data(), k[i], host.k_tensors()[i].size(),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(cudaMemcpy(host.v_tensors()[i].data(), v[i], host.v_tensors()[i].size(),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
  }

  TestCache host;
  std::vector<int32_t> pages;
  std::vector<void*> k, v;
  cudaStream_t stream = nullptr;
  kvpark_client* client = nullptr;
  kvpark_device* device = nullptr;
  kvpark_status status = KVPARK_OK;
};

void park_all(CudaEngine& e, const std::vector<int32_t>& tokens) {
  const kvpark_publish_options options{1, KVPARK_CLASS_SHARED, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  kvpark_reservation* r = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(e.client, &options, tokens.data(), tokens.size(), 0, blocks, &r),
            KVPARK_OK);
  kvpark_transfer* t = nullptr;
  ASSERT_EQ(
      kvpark_device_park(e.device, r, e.pages.data(), e.pages.size(), 0, blocks * block_tokens, &t),
      KVPARK_OK);
  ASSERT_NE(kvpark_transfer_event(t, 0), nullptr);
  ASSERT_EQ(kvpark_transfer_wait(t, 30'000), KVPARK_OK);
  kvpark_transfer_free(t);
  ASSERT_EQ(kvpark_seal(r), KVPARK_OK);
}

// Restores every block layer by layer, checks each layer as it is signalled, then the whole.
void restore_all_layerwise(CudaEngine& reader, CudaEngine& writer,
                           const std::vector<int32_t>& tokens) {
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(reader.client, 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  ASSERT_EQ(kvpark_plan_block_count(plan), blocks);
  for (uint32_t b = 0; b < blocks; ++b) {  // the parked payload is the documented image
    const std::vector<uint8_t> want = reference_image(writer.host, writer.pages, b);
    ASSERT_EQ(std::memcmp(kvpark_plan_block(plan, b), want.data(), want.size()), 0) << b;
  }
  kvpark_transfer* t = nullptr;
  ASSERT_EQ(kvpark_device_restore(reader.device, plan, reader.pages.data(), reader.pages.size(), 0,
                                  blocks * block_tokens, 0, 0, KVPARK_TRANSFER_LAYERWISE, &t),
            KVPARK_OK);
  const uint32_t layers = reader.host.geometry().layers;
  for (uint32_t l = 0; l < layers; ++l) {
    ASSERT_NE(kvpark_transfer_event(t, l), nullptr);
    ASSERT_EQ(kvpark_transfer_wait_layer(t, l, 30'000), KVPARK_OK) << "layer " << l;
  }
  ASSERT_EQ(kvpark_transfer_wait(t, 30'000), KVPARK_OK);
  kvpark_transfer_free(t);
  kvpark_plan_release(plan);
  reader.download();
}

class DeviceCudaRoundTrip : public ::testing::TestWithParam<std::tuple<KvLayout, KvFusion>> {};

TEST_P(DeviceCudaRoundTrip, RestoresEveryParkedByteIntoAnotherPageTable) {
  SKIP_WITHOUT_GPU();
  const auto [layout, fusion] = GetParam();
  const KvCacheGeometry g = geometry(layout, fusion, 2, 4, 4, 64);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  CudaEngine writer(daemon, g, 71);
  CudaEngine reader(daemon, g, 72);
  ASSERT_EQ(writer.status, KVPARK_OK);
  ASSERT_EQ(reader.status, KVPARK_OK);
  const std::vector<int32_t> tokens = prompt(9);
  park_all(writer, tokens);
  restore_all_layerwise(reader, writer, tokens);
  TestCache expected(g, 72);
  copy_reference(writer.host, writer.pages, expected, reader.pages, 0, blocks * block_tokens);
  EXPECT_EQ(reader.host.snapshot(), expected.snapshot());
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeviceCudaRoundTrip,
                         ::testing::Combine(::testing::Values(KvLayout::nhd, KvLayout::hnd),
                                            ::testing::Values(KvFusion::separate, KvFusion::fused)),
                         [](const auto& case_info) {
                           return kernels::testing::geometry_name(std::get<0>(case_info.param),
                                                                  std::get<1>(case_info.param), 2);
                         });

TEST(DeviceCuda, RegistersTheNewArenaAfterADaemonRestart) {
  SKIP_WITHOUT_GPU();
  const KvCacheGeometry g = geometry(KvLayout::nhd, KvFusion::separate, 2, 4, 4, 64);
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  CudaEngine writer(daemon, g, 81);
  CudaEngine reader(daemon, g, 82);
  ASSERT_EQ(writer.status, KVPARK_OK);
  ASSERT_EQ(reader.status, KVPARK_OK);
  park_all(writer, prompt(10));
  restore_all_layerwise(reader, writer, prompt(10));
  ASSERT_TRUE(daemon.restart());
  // The same devices: their clients reconnect on the next call and map a new arena.
  const std::vector<int32_t> tokens = prompt(11);
  park_all(writer, tokens);
  restore_all_layerwise(reader, writer, tokens);
  TestCache expected(g, 82);
  copy_reference(writer.host, writer.pages, expected, reader.pages, 0, blocks * block_tokens);
  EXPECT_EQ(reader.host.snapshot(), expected.snapshot());
}

TEST(DeviceCuda, AttachReportsUnavailableWithoutADevice) {
  std::string reason;
  if (have_device(&reason)) GTEST_SKIP() << "a CUDA device is present";
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  const KvCacheGeometry g = geometry(KvLayout::nhd, KvFusion::separate);
  const kvpark_namespace ns = block_namespace(7, g);
  kvpark_client* client = nullptr;
  ASSERT_EQ(kvpark_connect(daemon.socket_path().c_str(), &ns, &client), KVPARK_OK);
  TestCache cache(g, 1);
  kvpark_kv_cache kv = host_cache(cache);
  kv.memory = KVPARK_MEMORY_CUDA;
  kvpark_device* device = nullptr;
  EXPECT_EQ(kvpark_device_attach(client, &kv, nullptr, &device), KVPARK_UNAVAILABLE);
  kvpark_disconnect(client);
}

}  // namespace
}  // namespace kvpark::device_testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::string reason;
  return rc == 0 && !kvpark::device_testing::have_device(&reason) ? 77 : rc;
}

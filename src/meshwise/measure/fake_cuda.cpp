// A fake CUDA device for the CPU build of torch (meshwise/measure/fake_cuda.py; verify's trace
// processes only). Two registrations, made when this library loads, before torch is imported:
// - a device guard for CUDA that does nothing (c10's own FakeGuardImpl): autograd asks the guard of
//   every device a tensor of the graph is on (InputMetadata, AccumulateGrad), and the CPU build has
//   none for CUDA ("PyTorch is not linked with support for cuda devices");
// - CUDA hooks that say CUDA is built (isBuilt) and has no context on any device (hasPrimaryContext):
//   at::accelerator::getAccelerator() picks the accelerator from getCUDAHooks().isBuilt(), and the
//   autograd engine (Node::stream, InputBuffer::add) asks it for the stream of a cuda tensor's
//   gradient ("Cannot access accelerator device when none is available"). getCUDAHooks() keeps the
//   first hooks it finds, and importing torch asks for them, hence the load before the import.
// Everything else of CUDAHooksInterface keeps its CPU-build answer (hasCUDA() false, no generator,
// no allocator): fake tensors allocate nothing and draw no random numbers.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace at {
namespace {
struct FakeCUDAHooks : CUDAHooksInterface {
  explicit FakeCUDAHooks(CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return false; }
};
}  // namespace
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, FakeCUDAHooks)
}  // namespace at

namespace c10::impl {
namespace {
C10_REGISTER_GUARD_IMPL(CUDA, FakeGuardImpl<DeviceType::CUDA>);
}  // namespace
}  // namespace c10::impl

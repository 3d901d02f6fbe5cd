// Shared by the hardware tests: where the fake vendor libraries are and how to script them.
#ifndef FLEXNPU_TESTS_FAKES_FAKES_H_
#define FLEXNPU_TESTS_FAKES_FAKES_H_

#include <dlfcn.h>
#include <stdlib.h>

#include <string>

#include "pjrt_flexnpu/hardware/hardware.h"

#ifndef FLEXNPU_FAKES_DIR
#define FLEXNPU_FAKES_DIR "tests/fakes"
#endif

namespace flexnpu::hardware::testing {

inline std::string FakePath(const std::string& relative) {
  return std::string(FLEXNPU_FAKES_DIR) + "/" + relative;
}
inline std::string FakeAcl() { return FakePath("ascendcl/libascendcl.so"); }
inline std::string FakeDcmi() { return FakePath("dcmi/libdcmi.so"); }
inline std::string FakeNvml() { return FakePath("nvml/libnvidia-ml.so.1"); }
inline std::string FakeCuda() { return FakePath("cuda/libcuda.so.1"); }

// Options that only ever load fakes (never a real library from the loader path).
inline SourceOptions FakeOptions(TelemetryMode mode = TelemetryMode::kAuto) {
  SourceOptions o;
  o.mode = mode;
  o.ascendcl_library = FakeAcl();
  o.dcmi_library = FakePath("no-dcmi-here/libdcmi.so");
  o.nvml_library = FakeNvml();
  o.cuda_library = FakeCuda();
  return o;
}

// Sets the scripts for the duration of a test (and clears the others' state).
class ScriptedHardware {
 public:
  ScriptedHardware(const std::string& acl, const std::string& nvml) {
    setenv("FLEXNPU_FAKE_ACL", acl.c_str(), 1);
    setenv("FLEXNPU_FAKE_NVML", nvml.c_str(), 1);
    unsetenv("FLEXNPU_FAKE_ACL_FILE");
    unsetenv("FLEXNPU_FAKE_NVML_FILE");
    unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  }
  ~ScriptedHardware() {
    unsetenv("FLEXNPU_FAKE_ACL");
    unsetenv("FLEXNPU_FAKE_NVML");
    unsetenv("ASCEND_RT_VISIBLE_DEVICES");
  }
};

// A function of a fake for assertions (FakeAcl_RefCount ...); keeps the library loaded.
template <typename F>
F* FakeFunction(const std::string& library, const char* name) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  return handle == nullptr ? nullptr : reinterpret_cast<F*>(dlsym(handle, name));
}

}  // namespace flexnpu::hardware::testing

#endif  // FLEXNPU_TESTS_FAKES_FAKES_H_

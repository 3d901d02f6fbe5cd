// The emulated backend: a PJRT_Api of FlexNPU's own whose devices are accelerators of a
// preset of the one preset table (xla_passes/roofline.h), modelled, not real. Programs are
// compiled once by the XLA CPU plugin for their shapes and optimized HLO and never computed;
// buffers are metadata with a device and a ready time; an execution takes the preset's
// modelled time for its FLOPs and bytes. The runtime drives it like any physical plugin.
// docs/emulation.md is the user's contract.
#ifndef FLEXNPU_BACKEND_EMULATED_EMULATED_BACKEND_H_
#define FLEXNPU_BACKEND_EMULATED_EMULATED_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/emulated/config.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::emulated {

// The physical backend for `spec` ("emulate:<preset>"); an unknown preset is an error listing
// the known ones. One preset per process.
StatusOr<std::shared_ptr<const PhysicalBackend>> EmulatedBackend(const std::string& spec);

// How many programs the CPU plugin compiled for `client` (a client of the emulated backend):
// one per program, however many devices run it.
int64_t CpuCompiles(PJRT_Client* client);

// The instant (steady clock, ns) an event of the emulated backend turns ready: for tests, which
// check the modelled timeline without waiting for it.
int64_t EventReadyNs(PJRT_Event* event);

}  // namespace flexnpu::emulated

#endif  // FLEXNPU_BACKEND_EMULATED_EMULATED_BACKEND_H_

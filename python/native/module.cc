// flexnpu._native: the C++ cores (HLO analysis, placement, the daemon) exposed to Python, and
// the one way from Python into the loaded plugin's FlexNpu_* entry points.
#include <nanobind/nanobind.h>

#include "pjrt_flexnpu/base/phase.h"

namespace nb = nanobind;

namespace flexnpu::python {
// Each component registers its bindings from its own file in this folder.
void RegisterAnalysis(nb::module_& m);
void RegisterPlacement(nb::module_& m);
void RegisterHardware(nb::module_& m);
void RegisterDaemon(nb::module_& m);
void RegisterDaemonProtocol(nb::module_& m);
void RegisterPlugin(nb::module_& m);
}  // namespace flexnpu::python

NB_MODULE(_native, m) {
  m.doc() = "FlexNPU native cores";
  // The one phase enum (base/phase.h), by code: Python's views of it derive from this.
  nb::list phase_names;
  for (int p = 0; p < flexnpu::kNumPhases; ++p) {
    phase_names.append(flexnpu::PhaseName(static_cast<flexnpu::Phase>(p)));
  }
  m.attr("PHASE_NAMES") = nb::tuple(phase_names);
#ifdef FLEXNPU_HAVE_XLA_PASSES
  flexnpu::python::RegisterAnalysis(m);
#endif
#ifdef FLEXNPU_HAVE_PLACEMENT
  flexnpu::python::RegisterPlacement(m);
#endif
#ifdef FLEXNPU_HAVE_HARDWARE
  flexnpu::python::RegisterHardware(m);
#endif
#ifdef FLEXNPU_HAVE_DAEMON
  flexnpu::python::RegisterDaemon(m);
  flexnpu::python::RegisterDaemonProtocol(m);
#endif
  flexnpu::python::RegisterPlugin(m);
}

/* A fake libdcmi.so: utilisation for the fake AscendCL when its library lacks the call. Reads
 * the same script as fake_ascendcl.c: dcmi_aicore.N (percent, N = physical id = DCMI logic
 * id), error.dcmi_init=CODE. Card = logic id, chip 0. */
#include "fake_script.h"
#include "pjrt_flexnpu/hardware/vendor_api.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

static const fake_script kScript = {"FLEXNPU_FAKE_ACL", "FLEXNPU_FAKE_ACL_FILE"};

FAKE_EXPORT int dcmi_init(void) { return (int)fake_int(&kScript, "error.dcmi_init", -1, 0); }

FAKE_EXPORT int dcmi_get_card_id_device_id_from_logicid(int* card_id, int* device_id,
                                                        unsigned int device_logic_id) {
  *card_id = (int)device_logic_id;
  *device_id = 0;
  return 0;
}

FAKE_EXPORT int dcmi_get_device_utilization_rate(int card_id, int device_id, int input_type,
                                                 unsigned int* utilization_rate) {
  if (device_id != 0) return -8001; /* DCMI_ERR_CODE_INVALID_PARAMETER */
  const char* key = input_type == DCMI_UTILIZATION_AICORE ? "dcmi_aicore" : "dcmi_hbm";
  const long long value = fake_int(&kScript, key, card_id, -1);
  if (value < 0) return -8255; /* not supported */
  *utilization_rate = (unsigned int)value;
  return 0;
}

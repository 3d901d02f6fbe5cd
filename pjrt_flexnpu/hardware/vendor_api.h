/* The vendor functions and types FlexNPU uses, declared with the vendors' names, signatures and
 * values (CANN acl/acl_base.h + acl/acl_rt.h, DCMI dcmi_interface_api.h, NVML nvml.h, CUDA
 * cuda.h), written here rather than copied: only what the hardware layer calls. Plain C so that
 * the test fakes (tests/fakes/) implement exactly these prototypes. The hardware layer never
 * links these symbols: it resolves them with dlsym (decltype of the prototypes below). */
#ifndef FLEXNPU_HARDWARE_VENDOR_API_H_
#define FLEXNPU_HARDWARE_VENDOR_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- AscendCL (libascendcl.so) ---- */
typedef int aclError;
#define ACL_SUCCESS 0
typedef enum aclrtDevAttr {
  ACL_DEV_ATTR_AICORE_CORE_NUM = 101,
  ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE = 301
} aclrtDevAttr;
typedef enum aclrtMemAttr { ACL_DDR_MEM = 0, ACL_HBM_MEM = 1 } aclrtMemAttr;
typedef struct aclrtUtilizationExtendInfo aclrtUtilizationExtendInfo;
typedef struct aclrtUtilizationInfo {
  int32_t cubeUtilization;   /* percent; -1: unsupported */
  int32_t vectorUtilization;
  int32_t aicpuUtilization;
  int32_t memoryUtilization;
  aclrtUtilizationExtendInfo* utilizationExtend; /* reserved: must be NULL */
} aclrtUtilizationInfo;

aclError aclInit(const char* configPath);
aclError aclFinalize(void);
aclError aclrtGetDeviceCount(uint32_t* count);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
const char* aclrtGetSocName(void);
aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t* value);
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total);
aclError aclrtGetDeviceUtilizationRate(int32_t deviceId, aclrtUtilizationInfo* utilizationInfo);
const char* aclGetRecentErrMsg(void);

/* ---- DCMI (libdcmi.so), optional ---- */
#define DCMI_UTILIZATION_AICORE 2 /* input_type of dcmi_get_device_utilization_rate */
#define DCMI_UTILIZATION_HBM 6
int dcmi_init(void);
int dcmi_get_card_id_device_id_from_logicid(int* card_id, int* device_id,
                                            unsigned int device_logic_id);
int dcmi_get_device_utilization_rate(int card_id, int device_id, int input_type,
                                     unsigned int* utilization_rate);

/* ---- NVML (libnvidia-ml.so.1) ---- */
typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;
typedef struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
typedef struct nvmlPciInfo_st {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char* nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization);

/* ---- CUDA driver (libcuda.so.1): the PCI bus id of a CUDA ordinal ---- */
typedef int CUresult; /* enum cudaError_enum; CUDA_SUCCESS = 0 */
typedef int CUdevice;
CUresult cuInit(unsigned int Flags);
CUresult cuDeviceGetCount(int* count);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev);

#ifdef __cplusplus
}
#endif

#endif /* FLEXNPU_HARDWARE_VENDOR_API_H_ */

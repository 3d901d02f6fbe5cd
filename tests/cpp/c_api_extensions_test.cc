// FlexNPU's PJRT extension chain: well-formed, and its FFI extension forwards to the physical
// backend (a handler registered through it runs inside the inner plugin; execute contexts and
// their user data reach the inner execution). The inner is the CPU plugin the environment names.
#include <dlfcn.h>

#include <cstdlib>

#include "c_api_test_fixture.h"

namespace {

// The PJRT FFI extension, version 3 (no header ships with the plugin).
struct FfiTypeInfo {
  void (*deleter)(void*);
  void* serialize;
  void* deserialize;
};
struct FfiTypeRegisterArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* type_name;
  size_t type_name_size;
  int64_t type_id;
  const FfiTypeInfo* type_info;
};
struct FfiUserDataAddArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context;
  int64_t type_id;
  void* data;
  void (*deleter)(void*);  // only read when struct_size says so (older callers)
};
struct FfiRegisterHandlerArgs {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
};
struct FfiExtension {
  PJRT_Extension_Base base;
  PJRT_Error* (*type_register)(FfiTypeRegisterArgs*);
  PJRT_Error* (*user_data_add)(FfiUserDataAddArgs*);
  PJRT_Error* (*register_handler)(FfiRegisterHandlerArgs*);
};

// The few XLA FFI call-frame structs a typed handler reads (xla/ffi/api/c_api.h's layout).
struct XlaExtensionBase {
  size_t struct_size;
  int type;  // 1: metadata
  XlaExtensionBase* next;
};
struct XlaApiVersion {
  size_t struct_size;
  void* extension_start;
  int major_version;
  int minor_version;
};
struct XlaMetadata {
  size_t struct_size;
  XlaApiVersion api_version;
  uint32_t traits;
};
struct XlaMetadataExtension {
  XlaExtensionBase base;
  XlaMetadata* metadata;
};
struct XlaList {  // XLA_FFI_Args and XLA_FFI_Rets
  size_t struct_size;
  void* extension_start;
  int64_t size;
  void* types;
  void** items;
};
struct XlaCallFrame {
  size_t struct_size;
  XlaExtensionBase* extension_start;
  const void* api;
  void* ctx;
  int stage;  // 3: execute
  XlaList args;
  XlaList rets;
};
struct XlaBuffer {
  size_t struct_size;
  void* extension_start;
  int dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
};

// y = 2x + 1 over f32; declares FFI API 0.1 (it uses nothing newer).
extern "C" void* AffineHandler(XlaCallFrame* frame) {
  for (XlaExtensionBase* e = frame->extension_start; e != nullptr; e = e->next) {
    if (e->type == 1) {
      XlaMetadata* m = reinterpret_cast<XlaMetadataExtension*>(e)->metadata;
      m->api_version.major_version = 0;
      m->api_version.minor_version = 1;
      m->traits = 0;
      return nullptr;
    }
  }
  if (frame->stage != 3) return nullptr;
  auto* in = static_cast<XlaBuffer*>(frame->args.items[0]);
  auto* out = static_cast<XlaBuffer*>(frame->rets.items[0]);
  int64_t n = 1;
  for (int64_t i = 0; i < in->rank; ++i) n *= in->dims[i];
  for (int64_t i = 0; i < n; ++i) {
    static_cast<float*>(out->data)[i] = 2.0f * static_cast<const float*>(in->data)[i] + 1.0f;
  }
  return nullptr;
}

constexpr char kCustomCallProgram[] = R"(
module @custom_call {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @flexnpu_test_affine(%a) {api_version = 4 : i32} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
})";

const FfiExtension* Ffi() {
  for (const PJRT_Extension_Base* e = api->extension_start; e != nullptr; e = e->next) {
    if (e->type == PJRT_Extension_Type_FFI) return reinterpret_cast<const FfiExtension*>(e);
  }
  return nullptr;
}

TEST_F(CApiTest, ExtensionChainIsWellFormedAndOffersWhatTheBackendHas) {
  std::vector<int> types;
  for (const PJRT_Extension_Base* e = api->extension_start; e != nullptr; e = e->next) {
    ASSERT_LT(types.size(), 32u) << "the chain does not end";
    EXPECT_GE(e->struct_size, sizeof(PJRT_Extension_Base));
    for (int t : types) EXPECT_NE(t, static_cast<int>(e->type)) << "extension type twice";
    types.push_back(static_cast<int>(e->type));
  }
  // The CPU plugin has FFI; FlexNPU offers it with all three functions.
  const FfiExtension* ffi = Ffi();
  ASSERT_NE(ffi, nullptr);
  EXPECT_GE(ffi->base.struct_size, sizeof(FfiExtension));
  EXPECT_NE(ffi->type_register, nullptr);
  EXPECT_NE(ffi->user_data_add, nullptr);
  EXPECT_NE(ffi->register_handler, nullptr);
}

ErrorInfo Register(const char* target, const char* platform, void* handler, size_t size) {
  FfiRegisterHandlerArgs args{};
  args.struct_size = size;
  args.target_name = target;
  args.target_name_size = std::strlen(target);
  args.handler = handler;
  args.platform_name = platform;
  args.platform_name_size = std::strlen(platform);
  return Info(Ffi()->register_handler(&args));
}

TEST_F(CApiTest, FfiHandlerRegisteredWithFlexNpuRunsInsideThePhysicalBackend) {
  ASSERT_NE(Ffi(), nullptr);
  PJRT_Client* client = CreateClient(2);
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo missing = TryCompile(client, kCustomCallProgram, CompileOptionsFor(0), &exe);
  EXPECT_EQ(missing.code, PJRT_Error_Code_NOT_FOUND) << missing.message;
  EXPECT_NE(missing.message.find("No FFI handler registered for flexnpu_test_affine"),
            std::string::npos) << missing.message;

  // Registered after the client exists: it reaches the already attached backend.
  ErrorInfo ok = Register("flexnpu_test_affine", "flexnpu", reinterpret_cast<void*>(&AffineHandler),
                          sizeof(FfiRegisterHandlerArgs));
  ASSERT_EQ(ok.code, PJRT_Error_Code_OK) << ok.message;
  ErrorInfo compiled = TryCompile(client, kCustomCallProgram, CompileOptionsFor(0), &exe);
  ASSERT_EQ(compiled.code, PJRT_Error_Code_OK) << compiled.message;
  PJRT_Buffer* x = Upload(client, Device(client, 0), {0.f, 1.f, 2.f, 3.f});
  PJRT_Buffer* y = nullptr;
  ErrorInfo ran = TryExecute(exe, {x}, &y);
  ASSERT_EQ(ran.code, PJRT_Error_Code_OK) << ran.message;
  EXPECT_EQ(Download(y, 4), (std::vector<float>{1.f, 3.f, 5.f, 7.f}));

  // A client created later gets it too (replayed when its backend attaches).
  PJRT_Client* later = CreateClient(1);
  ASSERT_NE(later, nullptr);
  ErrorInfo again = TryCompile(later, kCustomCallProgram, CompileOptionsFor(0), &exe);
  EXPECT_EQ(again.code, PJRT_Error_Code_OK) << again.message;
}

TEST_F(CApiTest, FfiRegistrationErrorsNameWhatIsWrong) {
  ASSERT_NE(Ffi(), nullptr);
  ErrorInfo null_handler = Register("flexnpu_test_null", "flexnpu", nullptr,
                                    sizeof(FfiRegisterHandlerArgs));
  EXPECT_EQ(null_handler.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(null_handler.message.find("handler of 'flexnpu_test_null' is null"), std::string::npos)
      << null_handler.message;
  ErrorInfo small = Register("flexnpu_test_small", "flexnpu", reinterpret_cast<void*>(&AffineHandler), 16);
  EXPECT_EQ(small.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(small.message.find("args struct_size 16 is too small"), std::string::npos)
      << small.message;

  FfiUserDataAddArgs add{};
  add.struct_size = offsetof(FfiUserDataAddArgs, deleter);
  int not_a_context = 0;
  add.context = reinterpret_cast<PJRT_ExecuteContext*>(&not_a_context);
  ErrorInfo foreign = Info(Ffi()->user_data_add(&add));
  EXPECT_EQ(foreign.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(foreign.message.find("context is not a FlexNPU execute context"), std::string::npos)
      << foreign.message;
}

// y = 2x + 1 as AffineHandler, but declaring XLA FFI 0.<Minor> (as a handler built against a
// newer FFI header does).
template <int Minor>
void* AffineHandlerAt(XlaCallFrame* frame) {
  for (XlaExtensionBase* e = frame->extension_start; e != nullptr; e = e->next) {
    if (e->type == 1) {
      XlaMetadata* m = reinterpret_cast<XlaMetadataExtension*>(e)->metadata;
      m->api_version.major_version = 0;
      m->api_version.minor_version = Minor;
      m->traits = 0;
      return nullptr;
    }
  }
  return AffineHandler(frame);
}

std::string ProgramCalling(const std::string& target) {
  std::string program = kCustomCallProgram;
  const std::string name = "@flexnpu_test_affine(";
  program.replace(program.find(name), name.size(), "@" + target + "(");
  return program;
}

// The line of FlexNpu_FfiRoutes for `target` ("target\troute\thandler\tbackend\tpath").
std::vector<std::string> RouteOf(const std::string& target) {
  auto routes = reinterpret_cast<const char* (*)()>(dlsym(plugin_library, "FlexNpu_FfiRoutes"));
  if (routes == nullptr) return {};
  std::string text = routes();
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end - start);
    start = end == std::string::npos ? text.size() : end + 1;
    std::vector<std::string> fields;
    for (size_t at = 0;;) {
      size_t tab = line.find('\t', at);
      fields.push_back(line.substr(at, tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    if (!fields.empty() && fields[0] == target) return fields;
  }
  return {};
}

TEST_F(CApiTest, FfiHandlerNewerThanTheBackendsFfiRunsThroughTheVersionAdapter) {
  ASSERT_NE(Ffi(), nullptr);
  PJRT_Client* client = CreateClient(1);
  ASSERT_NE(client, nullptr);
  // FFI 0.3, as jaxlib 0.10.2's LAPACK kernels: adapted over a backend at FFI 0.2, direct over
  // one at 0.3 or newer; it runs either way.
  ErrorInfo ok = Register("flexnpu_test_affine_v3", "flexnpu",
                          reinterpret_cast<void*>(&AffineHandlerAt<3>), sizeof(FfiRegisterHandlerArgs));
  ASSERT_EQ(ok.code, PJRT_Error_Code_OK) << ok.message;
  std::vector<std::string> route = RouteOf("flexnpu_test_affine_v3");
  ASSERT_EQ(route.size(), 5u) << "no route reported";
  EXPECT_EQ(route[2], "0.3");
  ASSERT_EQ(route[3].rfind("0.", 0), 0u) << route[3];
  const int backend_minor = std::atoi(route[3].c_str() + 2);
  EXPECT_EQ(route[1], backend_minor < 3 ? "adapted" : "direct") << route[3];
  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo compiled = TryCompile(client, ProgramCalling("flexnpu_test_affine_v3"),
                                  CompileOptionsFor(0), &exe);
  ASSERT_EQ(compiled.code, PJRT_Error_Code_OK) << compiled.message;
  PJRT_Buffer* x = Upload(client, Device(client, 0), {0.f, 1.f, 2.f, 3.f});
  PJRT_Buffer* y = nullptr;
  ErrorInfo ran = TryExecute(exe, {x}, &y);
  ASSERT_EQ(ran.code, PJRT_Error_Code_OK) << ran.message;
  EXPECT_EQ(Download(y, 4), (std::vector<float>{1.f, 3.f, 5.f, 7.f}));

  // FFI 0.99: an ABI gap the adapter does not know; it is not adapted, and the backend refuses
  // it (at registration, or by dropping it: compiling then names the target).
  ErrorInfo too_new = Register("flexnpu_test_affine_v99", "flexnpu",
                               reinterpret_cast<void*>(&AffineHandlerAt<99>),
                               sizeof(FfiRegisterHandlerArgs));
  route = RouteOf("flexnpu_test_affine_v99");
  ASSERT_EQ(route.size(), 5u) << "no route reported";
  EXPECT_EQ(route[1], "too_new");
  if (too_new.code == PJRT_Error_Code_OK) {
    ErrorInfo missing = TryCompile(client, ProgramCalling("flexnpu_test_affine_v99"),
                                   CompileOptionsFor(0), &exe);
    EXPECT_EQ(missing.code, PJRT_Error_Code_NOT_FOUND) << missing.message;
    EXPECT_NE(missing.message.find("flexnpu_test_affine_v99"), std::string::npos)
        << missing.message;
  } else {
    EXPECT_NE(too_new.message.find("flexnpu_test_affine_v99"), std::string::npos)
        << too_new.message;
  }
}

int deleted_value = 0;
void DeleteValue(void* data) { deleted_value = *static_cast<int*>(data); }

TEST_F(CApiTest, ExecuteContextWithUserDataReachesTheInnerExecution) {
  ASSERT_NE(Ffi(), nullptr);
  PJRT_ExecuteContext_Create_Args create{};
  create.struct_size = PJRT_ExecuteContext_Create_Args_STRUCT_SIZE;
  ASSERT_PJRT_OK(api->PJRT_ExecuteContext_Create(&create));
  ASSERT_NE(create.context, nullptr);

  FfiTypeRegisterArgs type{};
  type.struct_size = sizeof(type);
  type.type_name = "flexnpu_test_type";
  type.type_name_size = std::strlen(type.type_name);
  ASSERT_PJRT_OK(Ffi()->type_register(&type));
  EXPECT_NE(type.type_id, 0);
  FfiTypeRegisterArgs again = type;
  again.type_id = 0;
  ASSERT_PJRT_OK(Ffi()->type_register(&again));
  EXPECT_EQ(again.type_id, type.type_id) << "one name, one id";

  static int value = 42;
  FfiUserDataAddArgs add{};
  add.struct_size = sizeof(add);  // an older caller: FlexNPU runs the deleter
  add.context = create.context;
  add.type_id = type.type_id;
  add.data = &value;
  add.deleter = &DeleteValue;
  ASSERT_PJRT_OK(Ffi()->user_data_add(&add));

  PJRT_Client* client = CreateClient(1);
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo compiled = TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe);
  ASSERT_EQ(compiled.code, PJRT_Error_Code_OK) << compiled.message;
  PJRT_Buffer* a = Upload(client, Device(client, 0), {1.f, 2.f, 3.f, 4.f});
  PJRT_ExecuteOptions options{};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  options.context = create.context;
  PJRT_Buffer* const arguments[] = {a, a};
  PJRT_Buffer* const* argument_lists[] = {arguments};
  PJRT_Buffer* output = nullptr;
  PJRT_Buffer** output_lists[] = {&output};
  PJRT_Event* done = nullptr;
  PJRT_LoadedExecutable_Execute_Args run{};
  run.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  run.executable = exe;
  run.options = &options;
  run.argument_lists = argument_lists;
  run.num_devices = 1;
  run.num_args = 2;
  run.output_lists = output_lists;
  run.device_complete_events = &done;
  ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_Execute(&run));
  Await(done);
  EXPECT_EQ(Download(output, 4), (std::vector<float>{2.f, 8.f, 18.f, 32.f}));
  DestroyBuffer(output);

  PJRT_ExecuteContext_Destroy_Args destroy{};
  destroy.struct_size = PJRT_ExecuteContext_Destroy_Args_STRUCT_SIZE;
  destroy.context = create.context;
  ASSERT_PJRT_OK(api->PJRT_ExecuteContext_Destroy(&destroy));
  EXPECT_EQ(deleted_value, 42);

  // A destroyed context is refused by name, not read.
  options.context = create.context;
  output = nullptr;
  ErrorInfo stale = Info(api->PJRT_LoadedExecutable_Execute(&run));
  EXPECT_EQ(stale.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(stale.message.find("options->context is not a FlexNPU execute context"),
            std::string::npos) << stale.message;
}

}  // namespace

namespace {

// The Layouts extension's first six functions (c_api/extensions_layouts.cc).
struct LayoutDestroyArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  void* layout;
};
struct LayoutSerializeArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  void* layout;
  const char* bytes;
  size_t bytes_size;
  void* serialized;
  void (*deleter)(void*);
};
struct ClientDefaultLayoutArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  void* layout;
};
struct BufferLayoutArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  void* layout;
};
struct OutputLayoutsArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
  void** layouts;
};
using ParameterLayoutsArgs = OutputLayoutsArgs;  // the same fields (num_parameters)
struct LayoutsExtension {
  PJRT_Extension_Base base;
  PJRT_Error* (*destroy)(LayoutDestroyArgs*);
  PJRT_Error* (*serialize)(LayoutSerializeArgs*);
  PJRT_Error* (*client_default_layout)(ClientDefaultLayoutArgs*);
  PJRT_Error* (*buffer_layout)(BufferLayoutArgs*);
  void* topology_default_layout;
  PJRT_Error* (*output_layouts)(OutputLayoutsArgs*);
  PJRT_Error* (*parameter_layouts)(ParameterLayoutsArgs*);  // C API 0.93+, when offered
};

const LayoutsExtension* Layouts() {
  for (const PJRT_Extension_Base* e = api->extension_start; e != nullptr; e = e->next) {
    if (e->type == PJRT_Extension_Type_Layouts) return reinterpret_cast<const LayoutsExtension*>(e);
  }
  return nullptr;
}

std::string Serialized(void* layout) {
  LayoutSerializeArgs args{};
  args.struct_size = sizeof(args);
  args.layout = layout;
  EXPECT_EQ(Info(Layouts()->serialize(&args)).code, PJRT_Error_Code_OK);
  std::string bytes(args.bytes, args.bytes_size);
  if (args.deleter != nullptr) args.deleter(args.serialized);
  return bytes;
}

void DestroyLayout(void* layout) {
  LayoutDestroyArgs args{};
  args.struct_size = sizeof(args);
  args.layout = layout;
  EXPECT_EQ(Info(Layouts()->destroy(&args)).code, PJRT_Error_Code_OK);
}

TEST_F(CApiTest, LayoutsOfClientBufferAndExecutableAreTheBackends) {
  ASSERT_NE(Layouts(), nullptr) << "the CPU plugin has Layouts: FlexNPU offers them";
  PJRT_Client* client = CreateClient(2);
  ASSERT_NE(client, nullptr);
  const int64_t dims[] = {4};
  ClientDefaultLayoutArgs def{};
  def.struct_size = sizeof(def);
  def.client = client;
  def.type = PJRT_Buffer_Type_F32;
  def.dims = dims;
  def.num_dims = 1;
  ASSERT_PJRT_OK(Layouts()->client_default_layout(&def));
  EXPECT_EQ(def.client, client) << "the caller's handle is given back";
  const std::string default_layout = Serialized(def.layout);
  EXPECT_FALSE(default_layout.empty());
  DestroyLayout(def.layout);

  PJRT_Buffer* x = Upload(client, Device(client, 1), {1.f, 2.f, 3.f, 4.f});
  BufferLayoutArgs of_buffer{};
  of_buffer.struct_size = sizeof(of_buffer);
  of_buffer.buffer = x;
  ASSERT_PJRT_OK(Layouts()->buffer_layout(&of_buffer));
  EXPECT_EQ(Serialized(of_buffer.layout), default_layout);
  DestroyLayout(of_buffer.layout);

  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo compiled = TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe);
  ASSERT_EQ(compiled.code, PJRT_Error_Code_OK) << compiled.message;
  PJRT_LoadedExecutable_GetExecutable_Args get{};
  get.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
  get.loaded_executable = exe;
  ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_GetExecutable(&get));
  OutputLayoutsArgs outputs{};
  outputs.struct_size = sizeof(outputs);
  outputs.executable = get.executable;
  ASSERT_PJRT_OK(Layouts()->output_layouts(&outputs));
  ASSERT_EQ(outputs.num_outputs, 1u);
  EXPECT_EQ(Serialized(outputs.layouts[0]), default_layout);
  PJRT_Executable_Destroy_Args destroy{};
  destroy.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
  destroy.executable = get.executable;
  ASSERT_PJRT_OK(api->PJRT_Executable_Destroy(&destroy));

  BufferLayoutArgs foreign{};
  foreign.struct_size = sizeof(foreign);
  int not_a_buffer = 0;
  foreign.buffer = reinterpret_cast<PJRT_Buffer*>(&not_a_buffer);
  ErrorInfo refused = Info(Layouts()->buffer_layout(&foreign));
  EXPECT_EQ(refused.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(refused.message.find("buffer is not a FlexNPU handle"), std::string::npos)
      << refused.message;
}

// The backend's own Layouts extension (its struct size says whether it has the 7th function).
const PJRT_Extension_Base* BackendExtension(PJRT_Extension_Type type) {
  const char* path = std::getenv("FLEXNPU_BACKEND");
  if (path == nullptr) path = std::getenv("FLEXNPU_CPU_PLUGIN_PATH");
  if (path == nullptr) return nullptr;
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return nullptr;
  auto get_api = reinterpret_cast<const PJRT_Api* (*)()>(dlsym(library, "GetPjrtApi"));
  if (get_api == nullptr) return nullptr;
  for (const PJRT_Extension_Base* e = get_api()->extension_start; e != nullptr; e = e->next) {
    if (e->type == type) return e;
  }
  return nullptr;
}

TEST_F(CApiTest, ParameterLayoutsAreOfferedExactlyWhenTheBackendHasThem) {
  ASSERT_NE(Layouts(), nullptr);
  const PJRT_Extension_Base* backend = BackendExtension(PJRT_Extension_Type_Layouts);
  ASSERT_NE(backend, nullptr) << "set FLEXNPU_BACKEND or FLEXNPU_CPU_PLUGIN_PATH";
  const bool backend_has = backend->struct_size >= sizeof(LayoutsExtension);
  if (!backend_has) {
    EXPECT_EQ(Layouts()->base.struct_size, offsetof(LayoutsExtension, parameter_layouts));
    GTEST_SKIP() << "this backend's Layouts has no GetParameterLayouts (C API < 0.93)";
  }
  ASSERT_EQ(Layouts()->base.struct_size, sizeof(LayoutsExtension));
  ASSERT_NE(Layouts()->parameter_layouts, nullptr);
  PJRT_Client* client = CreateClient(2);
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo compiled = TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe);
  ASSERT_EQ(compiled.code, PJRT_Error_Code_OK) << compiled.message;
  PJRT_LoadedExecutable_GetExecutable_Args get{};
  get.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
  get.loaded_executable = exe;
  ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_GetExecutable(&get));
  ParameterLayoutsArgs params{};
  params.struct_size = sizeof(params);
  params.executable = get.executable;
  ASSERT_PJRT_OK(Layouts()->parameter_layouts(&params));
  EXPECT_EQ(params.executable, get.executable) << "the caller's handle is given back";
  ASSERT_EQ(params.num_outputs, 2u);  // num_parameters: main(%a, %b)
  const int64_t dims[] = {4};
  ClientDefaultLayoutArgs def{};
  def.struct_size = sizeof(def);
  def.client = client;
  def.type = PJRT_Buffer_Type_F32;
  def.dims = dims;
  def.num_dims = 1;
  ASSERT_PJRT_OK(Layouts()->client_default_layout(&def));
  EXPECT_EQ(Serialized(params.layouts[0]), Serialized(def.layout));
  EXPECT_EQ(Serialized(params.layouts[1]), Serialized(def.layout));
  DestroyLayout(def.layout);
  PJRT_Executable_Destroy_Args destroy{};
  destroy.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
  destroy.executable = get.executable;
  ASSERT_PJRT_OK(api->PJRT_Executable_Destroy(&destroy));
}

// The MemoryDescriptions extension, version 1 (c_api/extensions_memory.cc).
struct MemoryDescriptionsArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const void* const* memory_descriptions;
  size_t num_memory_descriptions;
  size_t default_memory_index;
};
struct MemoryKindArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const void* memory_description;
  const char* kind;
  size_t kind_size;
  int kind_id;
};
struct MemoryDescriptionsExtension {
  PJRT_Extension_Base base;
  PJRT_Error* (*memory_descriptions)(MemoryDescriptionsArgs*);
  PJRT_Error* (*kind)(MemoryKindArgs*);
};

// The memory kinds the backend describes for device 0 of a client of its own.
std::vector<std::string> BackendMemoryKinds(const PJRT_Extension_Base* extension) {
  const char* path = std::getenv("FLEXNPU_BACKEND");
  if (path == nullptr) path = std::getenv("FLEXNPU_CPU_PLUGIN_PATH");
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // already loaded (and initialized)
  auto* inner = reinterpret_cast<const PJRT_Api* (*)()>(dlsym(library, "GetPjrtApi"))();
  PJRT_Client_Create_Args create{};
  create.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
  EXPECT_EQ(Info(inner->PJRT_Client_Create(&create)).code, PJRT_Error_Code_OK);
  PJRT_Client_AddressableDevices_Args devices{};
  devices.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE;
  devices.client = create.client;
  EXPECT_EQ(Info(inner->PJRT_Client_AddressableDevices(&devices)).code, PJRT_Error_Code_OK);
  PJRT_Device_GetDescription_Args description{};
  description.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
  description.device = devices.addressable_devices[0];
  EXPECT_EQ(Info(inner->PJRT_Device_GetDescription(&description)).code, PJRT_Error_Code_OK);
  const auto* ext = reinterpret_cast<const MemoryDescriptionsExtension*>(extension);
  MemoryDescriptionsArgs args{};
  args.struct_size = sizeof(args);
  args.device_description = description.device_description;
  EXPECT_EQ(Info(ext->memory_descriptions(&args)).code, PJRT_Error_Code_OK);
  std::vector<std::string> kinds;
  for (size_t i = 0; i < args.num_memory_descriptions; ++i) {
    MemoryKindArgs kind{};
    kind.struct_size = sizeof(kind);
    kind.memory_description = args.memory_descriptions[i];
    EXPECT_EQ(Info(ext->kind(&kind)).code, PJRT_Error_Code_OK);
    kinds.emplace_back(kind.kind, kind.kind_size);
  }
  PJRT_Client_Destroy_Args destroy{};
  destroy.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  destroy.client = create.client;
  EXPECT_EQ(Info(inner->PJRT_Client_Destroy(&destroy)).code, PJRT_Error_Code_OK);
  return kinds;
}

TEST_F(CApiTest, MemoryDescriptionsAreTheHomePhysicalDevicesAndMatchItsMemories) {
  const PJRT_Extension_Base* backend = BackendExtension(PJRT_Extension_Type_MemoryDescriptions);
  const MemoryDescriptionsExtension* ext = nullptr;
  for (const PJRT_Extension_Base* e = api->extension_start; e != nullptr; e = e->next) {
    if (e->type == PJRT_Extension_Type_MemoryDescriptions) {
      ext = reinterpret_cast<const MemoryDescriptionsExtension*>(e);
    }
  }
  if (backend == nullptr) {
    EXPECT_EQ(ext, nullptr) << "offered although the backend has none";
    GTEST_SKIP() << "this backend has no MemoryDescriptions";
  }
  ASSERT_NE(ext, nullptr) << "the backend has MemoryDescriptions: FlexNPU offers them";
  PJRT_Client* client = CreateClient(2);
  ASSERT_NE(client, nullptr);
  PJRT_Device_GetDescription_Args description{};
  description.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
  description.device = Device(client, 1);
  ASSERT_PJRT_OK(api->PJRT_Device_GetDescription(&description));
  MemoryDescriptionsArgs args{};
  args.struct_size = sizeof(args);
  args.device_description = description.device_description;
  ASSERT_PJRT_OK(ext->memory_descriptions(&args));
  EXPECT_EQ(args.device_description, description.device_description);
  std::vector<std::string> described;
  for (size_t i = 0; i < args.num_memory_descriptions; ++i) {
    MemoryKindArgs kind{};
    kind.struct_size = sizeof(kind);
    kind.memory_description = args.memory_descriptions[i];
    ASSERT_PJRT_OK(ext->kind(&kind));
    described.emplace_back(kind.kind, kind.kind_size);
  }
  // The default one is the kind of the device's default memory as FlexNPU reports it.
  PJRT_Device_DefaultMemory_Args memory{};
  memory.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE;
  memory.device = description.device;
  ASSERT_PJRT_OK(api->PJRT_Device_DefaultMemory(&memory));
  PJRT_Memory_Kind_Args memory_kind{};
  memory_kind.struct_size = PJRT_Memory_Kind_Args_STRUCT_SIZE;
  memory_kind.memory = memory.memory;
  ASSERT_PJRT_OK(api->PJRT_Memory_Kind(&memory_kind));
  // The backend's own answer for a device of its own client: the same kinds (the CPU plugins
  // here describe none for a client's devices: XLA's CPU device description lists no memories).
  EXPECT_EQ(described, BackendMemoryKinds(backend));
  if (!described.empty()) {
    ASSERT_LT(args.default_memory_index, described.size());
    EXPECT_EQ(described[args.default_memory_index],
              std::string(memory_kind.kind, memory_kind.kind_size));
  }

  int not_a_description = 0;
  args.device_description = reinterpret_cast<PJRT_DeviceDescription*>(&not_a_description);
  ErrorInfo refused = Info(ext->memory_descriptions(&args));
  EXPECT_EQ(refused.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(refused.message.find("device_description is not a FlexNPU handle"), std::string::npos)
      << refused.message;
  MemoryDescriptionsArgs small{};
  small.struct_size = 16;
  ErrorInfo too_small = Info(ext->memory_descriptions(&small));
  EXPECT_EQ(too_small.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(too_small.message.find("args struct_size 16 is too small"), std::string::npos)
      << too_small.message;
}

}  // namespace

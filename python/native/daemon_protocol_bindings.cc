// flexnpu._native daemon protocol bindings: the daemon's frames and their socket I/O
// (pjrt_flexnpu/daemon/protocol.h) for flexnpu._daemon_wire (observers such as
// `flexnpu stats --daemon`, protocol-level tests), so Python speaks the protocol through the
// C++ encoding the daemon itself uses.
//
// Errors are Python's socket errors: ConnectionError when the daemon cannot be reached or closes
// the connection, TimeoutError past the connection's timeout, OSError (by errno) otherwise;
// a malformed frame is a ValueError.
#ifdef FLEXNPU_HAVE_DAEMON
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pjrt_flexnpu/backend/remote/protocol.h"

namespace nb = nanobind;

namespace flexnpu::python {
namespace {

using daemon::Frame;

[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

std::string ErrnoText(int error) {
  return "[Errno " + std::to_string(error) + "] " + std::strerror(error);
}

// A frame's text as Python str (invalid UTF-8 replaced, as the text is only shown).
nb::str Text(const std::string& text) {
  PyObject* str = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()),
                                       "replace");
  if (str == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(str);
}

nb::list Blobs(const Frame& frame) {
  nb::list out;
  for (const std::string& blob : frame.blobs) out.append(nb::bytes(blob.data(), blob.size()));
  return out;
}

void SetBlobs(Frame* frame, const std::vector<nb::bytes>& blobs) {
  frame->blobs.clear();
  for (const nb::bytes& blob : blobs) frame->blobs.emplace_back(blob.c_str(), blob.size());
}

// A failed SendFrame / RecvFrame as the Python exception a socket raises (`error`: its errno).
[[noreturn]] void RaiseIoError(const Status& status, int error) {
  if (status.code() != Code::kUnavailable) Raise(PyExc_ValueError, status.message());
  if (status.message() == "closed" || status.message() == "connection closed mid-frame") {
    Raise(PyExc_ConnectionError, "the flexnpu daemon closed the connection");
  }
  if (error == EAGAIN || error == EWOULDBLOCK) Raise(PyExc_TimeoutError, "timed out");
  errno = error;
  PyErr_SetFromErrno(PyExc_OSError);
  throw nb::python_error();
}

// A blocking protocol connection over the daemon's Unix-domain socket; `timeout_s` bounds each
// send and receive. Descriptors the daemon passes along a frame are closed (observers map no
// segments).
class DaemonConnection {
 public:
  DaemonConnection(const std::string& path, double timeout_s) {
    if (!(timeout_s > 0)) Raise(PyExc_ValueError, "timeout_s must be positive");
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (path.size() >= sizeof(address.sun_path)) {
      Raise(PyExc_ConnectionError,
            "cannot connect to the flexnpu daemon at " + path + ": AF_UNIX path too long");
    }
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      PyErr_SetFromErrno(PyExc_OSError);
      throw nb::python_error();
    }
    timeval timeout{};
    timeout.tv_sec = static_cast<time_t>(timeout_s);
    timeout.tv_usec = static_cast<suseconds_t>((timeout_s - std::floor(timeout_s)) * 1e6);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    int rc;
    int error;
    {
      nb::gil_scoped_release release;
      rc = ::connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
      error = errno;
    }
    if (rc != 0) {
      Close();
      Raise(PyExc_ConnectionError,
            "cannot connect to the flexnpu daemon at " + path + ": " + ErrnoText(error));
    }
  }
  DaemonConnection(const DaemonConnection&) = delete;
  DaemonConnection& operator=(const DaemonConnection&) = delete;
  ~DaemonConnection() { Close(); }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void Send(const Frame& frame) {
    Status status;
    int error;
    {
      nb::gil_scoped_release release;
      status = daemon::SendFrame(fd_, frame);
      error = errno;
    }
    if (!status.ok()) RaiseIoError(status, error);
  }

  Frame Receive() {
    Frame frame;
    std::vector<int> fds;
    Status status;
    int error;
    {
      nb::gil_scoped_release release;
      status = daemon::RecvFrame(fd_, &frame, &fds);
      error = errno;
    }
    for (int fd : fds) ::close(fd);
    if (!status.ok()) RaiseIoError(status, error);
    return frame;
  }

 private:
  int fd_ = -1;
};

}  // namespace

void RegisterDaemonProtocol(nb::module_& m) {
  m.attr("DAEMON_PROTOCOL_VERSION") = daemon::kProtocolVersion;
  nb::enum_<daemon::Op>(m, "DaemonOp", nb::is_arithmetic())
      .value("HELLO", daemon::kHello)
      .value("BUFFER_FROM_HOST", daemon::kBufferFromHost)
      .value("BUFFER_TO_HOST_SIZE", daemon::kBufferToHostSize)
      .value("BUFFER_TO_HOST", daemon::kBufferToHost)
      .value("BUFFER_READY_EVENT", daemon::kBufferReadyEvent)
      .value("BUFFER_DELETE", daemon::kBufferDelete)
      .value("BUFFER_IS_DELETED", daemon::kBufferIsDeleted)
      .value("BUFFER_DESTROY", daemon::kBufferDestroy)
      .value("BUFFER_COPY_TO_MEMORY", daemon::kBufferCopyToMemory)
      .value("COMPILE", daemon::kCompile)
      .value("DESERIALIZE", daemon::kDeserialize)
      .value("OPTIMIZED_PROGRAM", daemon::kOptimizedProgram)
      .value("SERIALIZE", daemon::kSerialize)
      .value("EXECUTABLE_DELETE", daemon::kExecutableDelete)
      .value("EXECUTABLE_DESTROY", daemon::kExecutableDestroy)
      .value("EXECUTE", daemon::kExecute)
      .value("STATS", daemon::kStats)
      .value("EVENT_READY", daemon::kEventReady);

  nb::class_<Frame>(m, "DaemonFrame")
      .def(
          "__init__",
          [](Frame* frame, uint64_t call_id, uint32_t op, int32_t code, const std::string& text,
             const std::vector<int64_t>& ints, const std::vector<nb::bytes>& blobs) {
            new (frame) Frame{call_id, op, code, text, ints, {}};
            SetBlobs(frame, blobs);
          },
          nb::arg("call_id") = 0, nb::arg("op") = 0, nb::arg("code") = 0, nb::arg("text") = "",
          nb::arg("ints") = std::vector<int64_t>{}, nb::arg("blobs") = std::vector<nb::bytes>{})
      .def_rw("call_id", &Frame::call_id)
      .def_rw("op", &Frame::op)
      .def_rw("code", &Frame::code)
      .def_prop_rw(
          "text", [](const Frame& frame) { return Text(frame.text); },
          [](Frame& frame, const std::string& text) { frame.text = text; })
      .def_rw("ints", &Frame::ints)
      .def_prop_rw("blobs", &Blobs,
                   [](Frame& frame, const std::vector<nb::bytes>& blobs) { SetBlobs(&frame, blobs); })
      .def("__repr__", [](const Frame& frame) {
        return nb::str("Frame(call_id={}, op={}, code={}, text={!r}, ints={}, blobs={})")
            .format(frame.call_id, frame.op, frame.code, Text(frame.text), nb::cast(frame.ints),
                    Blobs(frame));
      });

  nb::class_<DaemonConnection>(m, "DaemonConnection")
      .def(nb::init<const std::string&, double>(), nb::arg("path"), nb::arg("timeout_s") = 10.0)
      .def("send", &DaemonConnection::Send, nb::arg("frame"))
      .def("receive", &DaemonConnection::Receive)
      .def("close", &DaemonConnection::Close);
}

}  // namespace flexnpu::python
#endif  // FLEXNPU_HAVE_DAEMON

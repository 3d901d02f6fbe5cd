// The daemon protocol: frames round-trip, malformed input is refused with a message, file
// descriptors travel with a frame, and description readers never read past the frame.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "pjrt_flexnpu/daemon/protocol.h"

namespace flexnpu::daemon {
namespace {

TEST(DaemonProtocol, FrameRoundTripsWithNegativeIntsAndBinaryBlobs) {
  Frame frame;
  frame.call_id = 1234567890123ull;
  frame.op = kExecute;
  frame.code = 8;
  frame.text = "tenant 'a'";
  frame.ints = {0, -1, 1LL << 40, -(1LL << 50)};
  frame.blobs = {std::string("\0\xff\x01", 3), ""};
  Frame decoded;
  ASSERT_TRUE(Decode(Encode(frame), &decoded).ok());
  EXPECT_EQ(decoded.call_id, frame.call_id);
  EXPECT_EQ(decoded.op, frame.op);
  EXPECT_EQ(decoded.code, 8);
  EXPECT_EQ(decoded.text, frame.text);
  EXPECT_EQ(decoded.ints, frame.ints);
  EXPECT_EQ(decoded.blobs, frame.blobs);
}

TEST(DaemonProtocol, TruncatedFrameIsRefused) {
  Frame frame;
  frame.op = kHello;
  frame.text = "a long enough tenant name";
  std::string bytes = Encode(frame);
  bytes.resize(bytes.size() - 5);
  Frame decoded;
  Status s = Decode(bytes, &decoded);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("malformed frame"), std::string::npos) << s.message();
}

TEST(DaemonProtocol, FramesAndDescriptorsCrossASocket) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  auto segment = SharedSegment::Create(100000, "test");
  ASSERT_TRUE(segment.ok()) << segment.status().message();
  std::memset(segment->data(), 7, 100000);
  Frame frame;
  frame.op = kBufferFromHost;
  frame.blobs = {std::string(200000, 'x')};  // larger than one socket buffer write
  Frame received;
  std::vector<int> fds;
  std::thread reader([&] { ASSERT_TRUE(RecvFrame(pair[1], &received, &fds).ok()); });
  ASSERT_TRUE(SendFrame(pair[0], frame, {segment->fd()}).ok());
  reader.join();
  EXPECT_EQ(received.blobs, frame.blobs);
  ASSERT_EQ(fds.size(), 1u);
  auto mapped = SharedSegment::Map(fds[0], 100000);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  EXPECT_EQ(static_cast<const char*>(mapped->data())[99999], 7);

  ::close(pair[0]);
  Status eof = RecvFrame(pair[1], &received, &fds);
  EXPECT_EQ(eof.code(), Code::kUnavailable);
  EXPECT_EQ(eof.message(), "closed");
  ::close(pair[1]);
}

TEST(DaemonProtocol, ASegmentShorterThanAnnouncedIsRefused) {
  auto segment = SharedSegment::Create(10, "short");
  ASSERT_TRUE(segment.ok());
  auto mapped = SharedSegment::Map(::dup(segment->fd()), 1 << 20);
  ASSERT_FALSE(mapped.ok());
  EXPECT_NE(mapped.status().message().find("holds 10 bytes"), std::string::npos)
      << mapped.status().message();
}

TEST(DaemonProtocol, DescriptionsRoundTripAndTruncationIsDetected) {
  BufferMeta meta;
  meta.id = 9;
  meta.type = 11;
  meta.on_device_size = 64;
  meta.memory = 2;
  meta.dims = {4, 4};
  meta.layout_type = 0;
  meta.minor_to_major = {1, 0};
  meta.tiles = {{8, 128}, {2}};
  std::vector<int64_t> ints;
  AppendBufferMeta(&ints, meta);
  BufferMeta back;
  IntCursor cursor(ints);
  ASSERT_TRUE(ReadBufferMeta(&cursor, &back));
  EXPECT_EQ(back.dims, meta.dims);
  EXPECT_EQ(back.tiles, meta.tiles);
  EXPECT_EQ(back.minor_to_major, meta.minor_to_major);
  ints.pop_back();
  IntCursor short_cursor(ints);
  EXPECT_FALSE(ReadBufferMeta(&short_cursor, &back));
  // A count larger than what is left is refused, not read past the end.
  std::vector<int64_t> lying = {1, 11, 4, 0, 1000000};
  IntCursor lying_cursor(lying);
  EXPECT_FALSE(ReadBufferMeta(&lying_cursor, &back));
}

}  // namespace
}  // namespace flexnpu::daemon

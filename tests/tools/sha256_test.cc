// SPDX-License-Identifier: Apache-2.0
// Sha256 (over Nettle) against the FIPS 180-4 example vectors (NIST CSRC "SHA256.pdf" and the
// long-message vector), fed whole and in every split, so padding at each block boundary is
// covered.
#include "sha256.h"

#include <gtest/gtest.h>

#include <string>

#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

TEST(Sha256, EmptyMessage) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, OneBlockMessageAbc) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlockMessage448Bits) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, TwoBlockMessage896Bits) {
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnop"
                       "jklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, OneMillionA) {
  Sha256 h;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(chunk);
  EXPECT_EQ(to_hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, AnySplitGivesTheSameDigest) {
  // Lengths around the 55/56/64-byte padding boundaries, each fed in two pieces at every point.
  for (std::size_t len : {55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u}) {
    std::string msg(len, '\0');
    for (std::size_t i = 0; i < len; ++i) msg[i] = static_cast<char>('a' + i % 26);
    const std::string whole = sha256_hex(msg);
    for (std::size_t cut = 0; cut <= len; ++cut) {
      Sha256 h;
      h.update(std::string_view(msg).substr(0, cut));
      h.update(std::string_view(msg).substr(cut));
      ASSERT_EQ(to_hex(h.finish()), whole) << "len " << len << " cut " << cut;
    }
  }
  // And one known value at exactly one block of input (64 bytes of 'a').
  EXPECT_EQ(sha256_hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, RefusesInputAfterFinish) {
  Sha256 h;
  h.update("abc");
  (void)h.finish();
  EXPECT_THROW(h.update("x"), UsageError);
  EXPECT_THROW((void)h.finish(), UsageError);
}

}  // namespace
}  // namespace zinf::tools

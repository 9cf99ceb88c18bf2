// SPDX-License-Identifier: Apache-2.0
#include "zinf/common/suggest.h"

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(EditDistance, CountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("stage", "stage"), 0u);
  EXPECT_EQ(edit_distance("Stage", "stage"), 1u);         // substitution
  EXPECT_EQ(edit_distance("betass", "betas"), 1u);        // deletion
  EXPECT_EQ(edit_distance("nvme_pth", "nvme_path"), 1u);  // insertion
  EXPECT_EQ(edit_distance("trian", "train"), 2u);         // a swap is two edits
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("sitting", "kitten"), 3u);  // symmetric
}

TEST(TypoDistance, TwoEditsOrOnePerSoManyCharacters) {
  EXPECT_EQ(typo_distance("", 4), 2u);
  EXPECT_EQ(typo_distance("abcdefgh", 4), 2u);
  EXPECT_EQ(typo_distance("abcdefghijkl", 4), 3u);
  EXPECT_EQ(typo_distance("abcdefghijkl", 3), 4u);
}

// The config reader's cases (one edit per 4 characters): what config_test expects from it.
TEST(ClosestMatch, ConfigKeys) {
  const std::vector<std::string_view> aio = {"block_size",           "queue_depth",
                                             "intra_op_parallelism", "single_submit",
                                             "overlap_events",       "thread_count"};
  const auto suggest = [&](std::string_view key) {
    return std::string(closest_match(key, aio, typo_distance(key, 4)));
  };
  EXPECT_EQ(suggest("thread_cnt"), "thread_count");
  EXPECT_EQ(suggest("intra_op_parallel"), "intra_op_parallelism");
  EXPECT_EQ(suggest("queue_dept"), "queue_depth");
  EXPECT_EQ(suggest("xyz"), "");  // nothing close: no suggestion
  const std::vector<std::string_view> top = {"train_batch_size", "zero_optimization", "zinf"};
  EXPECT_EQ(closest_match("trian_batch_size", top, typo_distance("trian_batch_size", 4)),
            "train_batch_size");
  EXPECT_EQ(closest_match("completely_different_thing", top, typo_distance("x", 4)), "");
  const std::vector<std::string_view> zero = {"stage", "stage3_max_live_parameters"};
  EXPECT_EQ(closest_match("Stage", zero, 2), "stage");
  EXPECT_EQ(closest_match("stage3_max_live_parameter", zero, 6), "stage3_max_live_parameters");
}

// The command line's cases (one edit per 3 characters), over owned strings.
TEST(ClosestMatch, CommandLineOptions) {
  const std::vector<std::string> known = {"--size", "--queue-depth", "--threads", "--json"};
  const auto suggest = [&](std::string_view word) {
    return std::string(closest_match(word, known, typo_distance(word, 3)));
  };
  EXPECT_EQ(suggest("--queue-dpth"), "--queue-depth");
  EXPECT_EQ(suggest("--queue-dept"), "--queue-depth");
  EXPECT_EQ(suggest("--jsn"), "--json");
  EXPECT_EQ(suggest("--frobnicate"), "");
}

TEST(ClosestMatch, TheFirstOfEqualCandidatesWins) {
  const std::vector<std::string_view> c = {"bat", "cat", "hat"};
  EXPECT_EQ(closest_match("xat", c, 2), "bat");
  EXPECT_EQ(closest_match("hat", c, 2), "hat");  // an exact match beats an earlier near one
}

TEST(ClosestMatch, TheLimitIsInclusive) {
  const std::vector<std::string_view> c = {"abcd"};
  EXPECT_EQ(closest_match("ab", c, 2), "abcd");
  EXPECT_EQ(closest_match("a", c, 2), "");
}

TEST(ClosestMatch, EmptyCandidatesAndHugeWords) {
  EXPECT_EQ(closest_match("x", std::span<const std::string_view>(), 2), "");
  // A word of a megabyte is skipped on its length alone (the result must come back at once).
  const std::string huge(1 << 20, 'a');
  const std::vector<std::string_view> c = {"aaaa", "block_size"};
  EXPECT_EQ(closest_match(huge, c, typo_distance(huge, 4)), "");
}

}  // namespace
}  // namespace zinf

// SPDX-License-Identifier: Apache-2.0
// The per-rank folder of a directory, DeepSpeed's layout: every rank of a job keeps its files
// in `<dir>/rank<R>` (the sharded engine and optimizer, `zinf bench io` under mpirun).
#pragma once

#include <memory>
#include <string>

namespace zinf::dist {

/// Returns `dir`/rank<R>, created (0700) if missing. Never followed if it is a link: IoError
/// naming it, as for anything there that is not a directory; IoError too if `dir` cannot be
/// opened. Safe to call from several ranks at once (one creates it, the others open it).
std::string rank_directory(const std::string& dir, int rank);

/// The rank<R> folders one process of a job keeps its files in (the sharded engine and
/// optimizer, `zinf bench io` under mpirun): each created (0700) or opened as rank_directory()
/// does, and removed again when this is destroyed if it is empty by then. The files zinf keeps
/// there have no names, so a run that ends normally leaves none, and its folder goes; one a
/// killed run left empty goes with the next run of that rank that ends normally. A folder
/// holding anything is left as it is, and a link is never followed (rmdir only, through the
/// parent's descriptor opened at add()).
class RankFolders {
 public:
  RankFolders();
  ~RankFolders();
  RankFolders(const RankFolders&) = delete;
  RankFolders& operator=(const RankFolders&) = delete;
  /// `dir`/rank<R>, created if missing (rank_directory()'s errors); removed at destruction if
  /// empty.
  std::string add(const std::string& dir, int rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::dist

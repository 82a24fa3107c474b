// What mlpplan prints: one JSON object per layout with the keys of DESIGN.md §2.8, or a table
// (one layout's memory by state, communication and step time; or a ranking of layouts).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/layout_estimate.hpp"

namespace mlptrain {

struct PlannedLayout {
  Config config;
  LayoutEstimate estimate;
};

nlohmann::json plan_json(const PlannedLayout& planned, int world, int ranks_per_node);

// The cluster and the world's node split, one line.
std::string cluster_line(const Cluster& cluster, int world, int ranks_per_node, const Precision& precision,
                         const DeviceConfig& device);
// One layout in full.
std::string layout_table(const PlannedLayout& planned, int world);
// Layouts that fit, fastest first, then those that do not, least over first (at most `top` of
// each kind; 0: all).
std::string ranking_table(const std::vector<PlannedLayout>& ranked, int top);

}  // namespace mlptrain

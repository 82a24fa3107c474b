// Enumerating a world's layouts (see layout_search.hpp).
#include "plan/layout_search.hpp"

#include "core/error.hpp"
#include "train/options.hpp"

namespace mlptrain {

namespace {

std::vector<int> divisors(int value) {
  std::vector<int> found;
  for (int divisor = 1; divisor <= value; ++divisor)
    if (value % divisor == 0) found.push_back(divisor);
  return found;
}

}  // namespace

std::vector<Config> every_layout(const Config& base, int world, const std::vector<int>& micro_batch_choices) {
  std::vector<Config> layouts;
  const std::vector<bool> offloads = base.device == Device::cpu ? std::vector<bool>{false} : std::vector<bool>{false, true};
  for (int tp : divisors(world)) {
    if (base.hidden % tp != 0) continue;  // the cheap refusals first: most splits fail here
    for (int pp : divisors(world / tp)) {
      if (pp > base.layers) continue;
      const int dp = world / tp / pp;
      for (int ep : base.moe_every > 0 ? divisors(dp) : std::vector<int>{1})
        for (int micro_batches : micro_batch_choices)
          for (int zero = 0; zero <= 3; ++zero)
            for (PipelineKind schedule : {PipelineKind::one_f_one_b, PipelineKind::gpipe}) {
              if (pp == 1 && schedule != PipelineKind::one_f_one_b) continue;  // no pipeline, no schedule
              for (bool recompute : {false, true})
                for (bool offload : offloads) {
                  Config config = base;
                  config.dp = dp;
                  config.tp = tp;
                  config.pp = pp;
                  config.ep = ep;
                  config.zero = zero;
                  config.schedule = schedule;
                  config.micro_batches = micro_batches;
                  config.recompute = recompute;
                  config.offload = offload;
                  try {
                    validate_options(config, world);
                  } catch (const UsageError&) {
                    continue;
                  }
                  layouts.push_back(std::move(config));
                }
            }
    }
  }
  return layouts;
}

}  // namespace mlptrain

// `std::cout << model.tp_plan()` as the README writes it: no using-declaration,
// no using-directive anywhere in this file, so the operator must be found by
// argument-dependent lookup on the Plan type itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tp/parallel/plan.h"

TEST(PlanPrint, StreamsAsAJsonObjectInPlanOrder) {
  const tp::parallel::Plan plan = tp::parallel::merge_plans(
      {{"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"}},
      {{"layers.*.mlp.down_proj", "rowwise_split_input"}});
  std::ostringstream out;
  out << plan;
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(out.str());
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j.size(), 3u);
  auto it = j.begin();
  EXPECT_EQ(it.key(), "layers.*.self_attn.q_proj");
  EXPECT_EQ(it.value(), "colwise");
  EXPECT_EQ((++it).key(), "layers.*.self_attn.o_proj");
  EXPECT_EQ((++it).key(), "layers.*.mlp.down_proj");
  EXPECT_EQ(it.value(), "rowwise_split_input");
}

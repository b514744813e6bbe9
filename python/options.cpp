#include "python/options.hpp"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <variant>

namespace py = pybind11;

namespace cuda_p2p::python {

namespace {

using config::Knob;
using config::Value;

py::object to_python(const Value& v) {
  if (const auto* b = std::get_if<bool>(&v)) return py::bool_(*b);
  if (const auto* i = std::get_if<int64_t>(&v)) return py::int_(*i);
  if (const auto* s = std::get_if<std::string>(&v)) return py::str(*s);
  return py::none();
}

const char* kind_name(config::Kind kind) {
  switch (kind) {
    case config::Kind::kBool:
      return "bool";
    case config::Kind::kBytes:
      return "bytes";
    case config::Kind::kInt:
      return "int";
    case config::Kind::kNames:
      return "names";
    case config::Kind::kString:
      return "string";
  }
  return "?";
}

// The property's docstring: the knob's help, its default, and how the variable joins in.
std::string option_doc(const Knob& k) {
  const bool optional = std::holds_alternative<std::optional<bool> Options::*>(k.field) ||
                        std::holds_alternative<std::optional<int64_t> Options::*>(k.field);
  const std::string unset = optional ? "None" : k.kind == config::Kind::kNames ? "'auto'" : "";
  std::string doc = k.help + "\n\n" + k.type + "; default: " + k.default_value + ".";
  if (!k.env.empty()) {
    doc += unset.empty() ? " Variable: " + k.env + "."
                         : " " + unset + ": " + k.env + " if set, else the default.";
  }
  return doc;
}

// Binds the Options property of knob `k`, whose field is `field`: a setter that checks (and leaves
// the option as it was when the check fails) where the field's type admits wrong values.
template <typename Field>
void bind_property(py::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>>& cls,
                   const Knob& k, Field field) {
  const std::string doc = option_doc(k);
  const std::string what = "Options." + k.option;
  const Knob* knob = &k;
  auto get = [field](const Options& o) { return o.*field; };
  using T = std::remove_reference_t<decltype(std::declval<Options>().*field)>;
  auto set = [field, knob, what](Options& o, const T& v) {
    if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      if (v) config::check(*knob, *v, what);
    } else if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, std::optional<bool>>) {
      config::check(*knob, v, what);
    }
    o.*field = v;
  };
  cls.def_property(k.option.c_str(), get, set, doc.c_str());
}

}  // namespace

void bind_options(py::handle pg) {
  py::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>> cls(
      pg, "Options",
      "Options of a cuda_p2p process group; pass as pg_options to init_process_group/new_group. "
      "Every property is a knob of docs/configuration.md.");
  cls.def(py::init<>());
  for (const auto& k : config::knobs()) {
    std::visit(
        [&](auto field) {
          if constexpr (!std::is_same_v<decltype(field), std::monostate>) {
            bind_property(cls, k, field);
          }
        },
        k.field);
  }
  // Not a knob of cuda_p2p's own: handed to the wrapped NCCL backend as it is.
  cls.def_property(
      "nccl_options",
      [](const Options& o) -> py::object {
        if (!o.nccl_options) return py::none();
        return py::cast(o.nccl_options);
      },
      [](Options& o, const py::object& v) {
        if (v.is_none()) {
          o.nccl_options.reset();
          return;
        }
        try {
          auto opts = v.cast<c10::intrusive_ptr<c10d::Backend::Options>>();
          TORCH_CHECK_TYPE(opts->backend == "nccl",
                           "cuda_p2p: Options.nccl_options must be a ProcessGroupNCCL.Options or "
                           "None, got options of backend '",
                           opts->backend, "'");
          o.nccl_options = std::move(opts);
        } catch (const py::cast_error&) {
          throw py::type_error(
              "cuda_p2p: Options.nccl_options must be a ProcessGroupNCCL.Options or None, got " +
              py::str(py::type::of(v)).cast<std::string>());
        }
      },
      "Options handed to the wrapped NCCL backend (ProcessGroupNCCL.Options), or None.");
}

void bind_knob_table(py::module_& m) {
  m.def(
      "_config_knobs",
      [] {
        py::list out;
        for (const auto& k : config::knobs()) {
          py::dict d;
          // The docs table's columns (docs/configuration.md).
          d["option"] = k.option;
          d["env"] = k.env;
          d["type"] = k.type;
          d["default"] = k.default_value;
          d["help"] = k.help;
          // The rules, for the tests.
          d["kind"] = kind_name(k.kind);
          d["min"] = k.min;
          d["max"] = k.max;
          d["step"] = k.step;
          py::list names;
          if (k.kind == config::Kind::kNames) {
            for (const auto& n : k.name_list()) names.append(n);
          }
          d["names"] = names;
          d["kill_switch"] = k.kill_switch();
          d["env_inverted"] = k.env_inverted;
          d["reported"] = k.reported;
          out.append(d);
        }
        return out;
      },
      "Every configuration knob (backend/knob_table.cpp): Options field, environment variable, "
      "type, default and help (docs/configuration.md is compared with them), and its rules "
      "(kind, min, max, step, names, kill_switch, env_inverted, reported).");
}

py::dict knob_config(const Config& c, const config::Context& ctx) {
  py::dict d;
  for (const auto& k : config::knobs()) {
    if (k.reported) d[py::str(k.option)] = to_python(k.read(c, ctx));
  }
  return d;
}

}  // namespace cuda_p2p::python

"""Mutation testing of chosen modules with mutmut: each module against only the tests that cover it.

Slow and not part of CI. Install the tool with `pip install -c constraints.txt -e ".[mutation]"`,
then:

    nice -n 15 .venv/bin/python scripts/mutation.py                  # every module in MODULES
    nice -n 15 .venv/bin/python scripts/mutation.py compose learning # modules whose path contains a word
    nice -n 15 .venv/bin/python scripts/mutation.py --survivors compose  # and list the survivors
    .venv/bin/python scripts/mutation.py --report XD    # the table from what a stopped run left
    nice -n 15 .venv/bin/python scripts/mutation.py --again compose  # the survivors only, after new tests
    nice -n 15 .venv/bin/python scripts/mutation.py "XD modules" --functions x__packed  # some functions only

Each module runs in its own copy of the checkout under .mutation/<name>/ (git-ignored), where a
generated setup.cfg tells mutmut to mutate that one file and to select from its test files only;
a second run of the same module reuses mutmut's cache there. It prints, per module: mutants,
killed, survived, timeout, the mutants judged equivalent (EQUIVALENT below, with the reason) and
the score: killed / (mutants - equivalent); mutants a run stopped for time did not reach are left
out (the mutants column then says how many ran of how many).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"

#: The tests of tests/test_training.py that build optimisers without training a network.
_FAST_TRAINING = tuple(
    f"tests/test_training.py::{name}"
    for name in (
        "test_schedules_and_step_decay",
        "test_parameter_groups_by_kind_and_overrides",
        "test_the_optimizer_setting_chooses_every_group_that_param_groups_leaves",
    )
)

#: The tests of tests/test_exact_sampling.py that exercise the exact sampler in about a second
#: (not: the comparisons with rejection sampling and the conditioned minimums, the paper mode's
#: and the CLI's).
_FAST_EXACT = tuple(
    f"tests/test_exact_sampling.py::{name}"
    for name in (
        "test_exact_mode_matches_exhaustive_enumeration",
        "test_exact_trees_check_and_keep_every_limit",
        "test_no_draft_is_rejected_where_shapes_cannot_conflict",
        "test_plans_carry_the_inside_probabilities",
        "test_same_seed_same_trees_and_streams_continue",
        "test_a_grammar_that_derives_nothing_says_so",
        "test_impossible_limits_give_up_with_the_reasons",
    )
)

#: The tests of tests/test_xd.py that take well under a second each (not: the two that train or
#: mutate networks for several seconds; the 1024- and 2048-point comparisons are marked slow).
_FAST_XD = tuple(
    f"tests/test_xd.py::{name}"
    for name in (
        "test_butterfly_at_init_is_the_fft_of_the_zero_padded_axis",
        "test_dense_matrix_multiplies_out_the_same_factors",
        "test_two_pass_blocks_are_the_dense_matrix",
        "test_butterfly_rejects_sizes_that_are_not_powers_of_two",
        "test_warm_start_is_the_convolution_forward_and_backward",
        "test_channels_last_is_the_convolution_over_tokens",
        "test_stage_by_stage_path_is_the_convolution_too",
        "test_two_pass_block_path_is_the_convolution_too",
        "test_long_axis_is_the_convolution_in_float32",
        "test_any_parameters_match_an_independent_complex_computation",
        "test_float32_matches_the_reference_at_the_benchmark_sizes",
        "test_gradcheck_in_float64",
        "test_runs_in_full_precision_under_autocast",
        "test_default_initialisation_is_a_fresh_convolution",
        "test_parameter_count_by_hand",
        "test_flops_by_hand",
        "test_registry_contract",
        "test_im_mode_matches_im2col_geometry",
        "test_infeasible_where_the_kernel_does_not_fit",
        "test_in_a_compiled_network",
    )
)

#: The tests of tests/test_workers.py that reach einspace.evaluators.worker (not: the data
#: cache, GPU shares, packing settings and the reaping of a dead driver's Ray).
_WORKER_TESTS = tuple(
    f"tests/test_workers.py::{name}"
    for name in (
        "test_a_worker_is_replaced_after_memory_and_cuda_errors_only",
        "test_every_kind_of_poisoning_error_is_tested_alone",
        "test_a_worker_is_replaced_after_each_kind_of_poisoning_error",
        "test_a_worker_is_replaced_when_device_memory_grows_past_its_first_evaluation",
        "test_the_gpu_share_travels_in_the_environment",
    )
)

#: The tests of tests/test_export.py that run the exported code in this process (not: the
#: agreement tests that run hundreds of networks, or one, in a fresh process: 5-60 s each).
_FAST_EXPORT = tuple(
    f"tests/test_export.py::{name}"
    for name in (
        "test_the_resnet18_export_reads_like_a_resnet",
        "test_exported_mixer_keeps_its_activations_dense",
        "test_the_vit_export_calls_scaled_dot_product_attention",
        "test_figure_3_block_is_written_as_by_hand",
        "test_terminals_without_a_plain_form_are_refused_by_name",
        "test_weights_round_trip_through_a_weights_only_file",
        "test_export_command_writes_the_file_and_weights",
        "test_export_command_errors_exit_2_without_a_traceback",
    )
)

#: The tests of tests/test_fx_import.py and tests/test_import_zoo.py that import a model in well
#: under a second (not: the bigger seeds' reference models, the torchvision ResNet-18 with
#: substitutes, the commands, the exports of searched and sampled trees).
_FAST_IMPORT = (
    *(
        f"tests/test_fx_import.py::{name}"
        for name in (
            "test_reference_model_imports_to_the_bundled_seed[resnet_small]",
            "test_reference_model_imports_to_the_bundled_seed[vit]",
            "test_small_mixer_imports_and_computes_the_same",
            "test_torchvision_resnet18_needs_the_max_pool_substituted",
            "test_attention_imports_to_the_grammar_attention",
            "test_conv_net_without_biases_computes_the_same",
            "test_a_model_without_the_paper_head_imports_as_a_backbone",
            "test_what_the_grammar_cannot_express_is_located",
            "test_substitutes_are_used_when_asked_for_and_listed",
            "test_a_given_grammar_is_the_one_obeyed",
            "test_untraceable_model_is_an_error",
        )
    ),
    *(
        f"tests/test_import_zoo.py::{name}"
        for name in (
            "test_unfold_then_fold_imports_as_im2col_and_col2im",
            "test_unfold_read_raw_is_im2col_then_a_swap",
            "test_inference_identities_before_the_head_are_left_out",
            "test_a_slice_before_the_head_is_named_as_the_cause",
            "test_stochastic_depth_dropout_and_optional_arguments",
            "test_zoo_models_import_exactly_with_their_weights",
        )
    ),
)

#: name -> (the file to mutate, the functions to mutate in it or () for all, the test files that
#: cover it: the only ones mutmut may run for its mutants; a pytest node id `file::test` picks the
#: fast tests of a file whose others train networks). A function is mutmut's mangled name
#: without the module: `x_name` for a function, `xǁClassǁmethod` for a method.
MODULES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "run identity": (
        "search/config.py",
        ("xǁExperimentǁidentity", "x_grammar_digest", "x__file_digest"),
        ("tests/test_search_config.py", "tests/test_mutation_identity.py"),
    ),
    "experiment sections": (
        "search/config.py",
        (
            "x__section_spec",
            "xǁMultiFidelitySectionǁ_enabled",
            "xǁMultiFidelitySectionǁ_continues",
            "xǁExperimentǁ_directory",
        ),
        ("tests/test_search_config.py", "tests/test_mutation_config.py"),
    ),
    "run identity changes": (
        "search/loop.py",
        ("x_identity_changes", "x__short"),
        ("tests/test_search_config.py", "tests/test_mutation_identity.py"),
    ),
    "search run": (
        "search/loop.py",
        (
            "xǁRunSummaryǁ_results",
            "xǁSearchRunǁ_strategy",
            "xǁSearchRunǁ_grammar",
            "xǁSearchRunǁ_plugin_hint_steps",
            "xǁ_Sessionǁ_driving_steps",
        ),
        ("tests/test_mutation_loop.py",),
    ),
    "grammar composition": (
        "einspace/grammar/compose.py",
        (),
        ("tests/test_compose.py", "tests/test_grammar.py", "tests/test_mutation_compose.py"),
    ),
    "auxiliary losses": (
        "evaluators/auxiliary.py",
        (),
        ("tests/test_trainable.py", "tests/test_mutation_auxiliary.py"),
    ),
    "optimiser groups": (
        "evaluators/optim.py",
        (),
        (*_FAST_TRAINING, "tests/test_mutation_optim.py"),
    ),
    "learned probabilities": (
        "einspace/grammar/learning.py",
        (),
        ("tests/test_learned_probabilities.py", "tests/test_mutation_learning.py"),
    ),
    "exact sampler": (
        "einspace/sampling/exact.py",
        (),
        (*_FAST_EXACT, "tests/test_mutation_exact.py"),
    ),
    "XD ops": ("einspace/ops/xd.py", (), (*_FAST_XD, "tests/test_mutation_xd.py")),
    "XD modules": ("einspace/ops/_xd_modules.py", (), (*_FAST_XD, "tests/test_mutation_xd.py")),
    "XD butterflies": ("einspace/ops/_xd_butterflies.py", (), (*_FAST_XD, "tests/test_mutation_xd.py")),
    "NOS ops": ("einspace/ops/nos.py", (), ("tests/test_nos.py", "tests/test_mutation_nos.py")),
    "NOS modules": ("einspace/ops/_nos_modules.py", (), ("tests/test_nos.py", "tests/test_mutation_nos.py")),
    "DNArch ops": ("einspace/ops/dnarch.py", (), ("tests/test_dnarch.py", "tests/test_mutation_dnarch.py")),
    "DNArch modules": (
        "einspace/ops/_dnarch_modules.py",
        (),
        ("tests/test_dnarch.py", "tests/test_mutation_dnarch.py"),
    ),
    "export": ("einspace/network/export/writer.py", (), ("tests/test_mutation_export.py", *_FAST_EXPORT)),
    "fx import": (
        "einspace/network/importer/converter.py",
        (),
        ("tests/test_mutation_import.py", "tests/test_mutation_converter.py", *_FAST_IMPORT),
    ),
    "fx import head": (
        "einspace/network/importer/head.py",
        (),
        (
            "tests/test_mutation_import.py",
            "tests/test_mutation_converter.py",
            "tests/test_head_pooling.py",
            *_FAST_IMPORT,
        ),
    ),
    "fx import layers": (
        "einspace/network/importer/layers.py",
        (),
        (
            "tests/test_mutation_import.py",
            "tests/test_mutation_converter.py",
            "tests/test_import_affine.py",
            *_FAST_IMPORT,
        ),
    ),
    "workers": ("evaluators/worker.py", (), (*_WORKER_TESTS, "tests/test_mutation_workers.py")),
    "head fit": ("evaluators/head_fit.py", (), ("tests/test_head_fit.py",)),
    "mutation operators": (
        "einspace/sampling/variation.py",
        (),
        ("tests/test_mutation_operators.py", "tests/test_variation.py", "tests/test_min_limits.py"),
    ),
}

#: file -> mutmut's timeout_multiplier where its default (15) is too patient: a mutant is stopped
#: after 2 * multiplier * (1 s + its tests' time) of CPU. learning.py's bisection loop has mutants
#: that never end; at 15 each waited minutes for its timeout, at 2 about 4x its tests' time (a
#: timeout is a hang caught: it counts as killed).
TIMEOUT_MULTIPLIER: dict[str, float] = {"einspace/grammar/learning.py": 2.0}

#: (file, mutant name) -> why the mutant cannot change behaviour (not counted in the score).
#: Mutant names are mutmut's: <module path as dots>.x_<function>__mutmut_<n>; for methods
#: <module>.xǁ<Class>ǁ<method>__mutmut_<n>.
_AT_TOLERANCE = (
    "differs only when a float sum lands exactly on 1 ± 1e-6, which no probabilities written with "
    "a few digits produce (1 - fl(1e-6) is not a double near 1)"
)
#: DNArch methods whose zip(strict=True) has three mutants (strict=None, False, left out): their numbers.
_DNARCH_ZIPS = {
    ("LowPass", "architecture_metrics"): (12, 16, 17),
    ("ResidualStack", "forward"): (12, 16, 17),
    ("MaskedConv", "architecture_metrics"): (4, 7, 14),
}
EQUIVALENT: dict[tuple[str, str], str] = {
    ("einspace/grammar/compose.py", "einspace.grammar.compose.x__add__mutmut_19"): _AT_TOLERANCE,  # <= -> <
    (
        "einspace/grammar/compose.py",
        "einspace.grammar.compose.x__reweight__mutmut_40",
    ): _AT_TOLERANCE,  # > -> >=
    (
        "einspace/grammar/compose.py",
        "einspace.grammar.compose.x__reweight__mutmut_44",
    ): _AT_TOLERANCE,  # >= -> >
    (
        "einspace/grammar/compose.py",
        "einspace.grammar.compose.x__reweight__mutmut_62",
    ): _AT_TOLERANCE,  # > -> >=
    **{
        ("evaluators/auxiliary.py", f"einspace.evaluators.auxiliary.{name}"): why
        for name, why in {
            "x_check_auxiliary_settings__mutmut_11": "default weight only checked >= 0",
            "x_check_auxiliary_settings__mutmut_38": "n=3: only close[0] is read",
            "x_check_auxiliary_settings__mutmut_40": "n=2: only close[0] is read",
            "x_check_auxiliary_settings__mutmut_50": "'none' is unreachable: complexity is always registered",
            "x_check_auxiliary_settings__mutmut_51": "'none' is unreachable: complexity is always registered",
            "xǁAuxiliaryObjectiveǁ__call____mutmut_5": "network unread, providers given",
            "xǁAuxiliaryObjectiveǁ__call____mutmut_6": "providers found again: same list",
            "xǁAuxiliaryObjectiveǁ__call____mutmut_8": "providers found again: same list",
            "xǁAuxiliaryObjectiveǁ__init____mutmut_2": "network unread, providers given",
        }.items()
    },
    **{
        ("evaluators/optim.py", f"einspace.evaluators.optim.{name}"): why
        for name, why in {
            "x__frozen_then__mutmut_1": "<= 0 -> < 0: freezing for 0 steps compares step < 0, never true",
            "x__with_warmup__mutmut_2": "<= 0 -> <= 1: a ramp over <= 1 step is min(1, >= 1) = 1 already",
            "x_build_optimizer__mutmut_146": "every group sets its own lr; the optimiser's default is unread",
            "x_build_optimizer__mutmut_29": "the placeholder of a parameterless network is read by nothing",
            "x_build_optimizer__mutmut_31": "the placeholder of a parameterless network is read by nothing",
            "x_check_param_groups__mutmut_8": "n=3: only close[0] is read",
            "x_check_param_groups__mutmut_10": "n=2: only close[0] is read",
            "x_parameter_groups__mutmut_3": "recurse=None is falsy like False",
        }.items()
    },
    **{
        ("einspace/sampling/exact.py", f"einspace.sampling.exact.{name}"): why
        for names, why in (
            (
                (
                    "xǁExactSamplerǁ_expand__mutmut_50",
                    "xǁExactSamplerǁ_step__mutmut_3",
                    "xǁExactSamplerǁ_op__mutmut_18",
                    "xǁ_PlanBookǁplan__mutmut_1",
                    "xǁ_PlanBookǁplan__mutmut_2",
                ),
                "a memo bypassed: the same value is computed again",
            ),
            (
                tuple(f"xǁExactSamplerǁ_setup__mutmut_{n}" for n in (32, 33, 34, 35)),
                "the counters are reset at the start of every draft",
            ),
            (
                ("xǁExactSamplerǁ_expand__mutmut_4",),
                "> -> >= at a symbol: a symbol reaching max_nodes has a leaf below it, rejected anyway",
            ),
            (
                ("xǁ_PlanBookǁ_build_plan__mutmut_10",),
                "plans are built only for (symbol, modes) of positive inside mass, which have a rule",
            ),
            (
                ("xǁ_PlanBookǁ_build_plan__mutmut_37",),
                "a pruning test at a larger height: paths not ending in the target get no option",
            ),
            (
                ("xǁ_PlanBookǁ_make_step__mutmut_36",),
                "kind None falls through to the repeat branch in _expand and _step",
            ),
            (
                (
                    "x__stack_depth__mutmut_2",
                    "xǁExactSamplerǁsample__mutmut_14",
                    "xǁExactSamplerǁsample__mutmut_15",
                ),
                "only more recursion headroom while drawing (the limit is restored after)",
            ),
        )
        for name in names
    },
    **{
        ("einspace/grammar/learning.py", f"einspace.grammar.learning.x_{name}__mutmut_{n}"): why
        for name, numbers, why in (
            ("with_probabilities", (6, 9, 10), "zip(strict=...): the lengths were compared just above"),
            ("with_probabilities", (33, 36, 37), "zip(strict=...): the row's length was compared just above"),
            ("_estimate", (4, 7, 8, 18, 21, 22), "zip(strict=...): counts are made from the same rules"),
            ("learn_probabilities", (44, 47, 48, 51, 54, 55), "zip(strict=...): rows of the same rules"),
            ("with_probabilities", (18,), "> -> >=: differs only for a sum exactly 1e-9 away from 1"),
            (
                "learn_probabilities",
                (91,),
                "/ for //: from (0, 32) every interval halves, good + bad is even",
            ),
        )
        for n in numbers
    },
    **{
        ("einspace/ops/_xd_butterflies.py", f"einspace.ops._xd_butterflies.{name}"): why
        for names, why in (
            (
                tuple(f"x_butterfly_blocks__mutmut_{n}" for n in (6, 7, 8)),
                "another split of the stages between the two passes: the same factors regrouped",
            ),
            (
                ("x_dft_twiddles__mutmut_19", "x_dft_twiddles__mutmut_51"),
                "per_stage 2.0 at n = 1 scales an empty tensor; arange(n / 2) = arange(n // 2) for even n, "
                "and n = 1 runs no stage",
            ),
        )
        for name in names
    },
    **{
        ("einspace/ops/_xd_modules.py", f"einspace.ops._xd_modules.{name}"): why
        for names, why in (
            (
                tuple(f"x__column_major__mutmut_{n}" for n in (1, 2, 5, 6, 7, 8, 9, 10, 11))
                + tuple(f"x__unit_stride__mutmut_{n}" for n in (1, 2, 3, 4, 5, 6, 7, 10, 11)),
                "layout only: a product computed transposed, or a copy made or skipped; the same values",
            ),
            (
                tuple(
                    f"xǁXDConvǁ_butterflies__mutmut_{n}"
                    for n in (11, 13, 14, 18, 21, 22, 52, 54, 59, 71, 76, 77)
                )
                + tuple(f"xǁXDConvǁ_xd__mutmut_{n}" for n in (49, 52, 53)),
                "zip(strict=...): one entry per axis and per butterfly (K, L, M) on every side",
            ),
            (
                tuple(f"xǁXDConvǁ_butterflies__mutmut_{n}" for n in (47, 48, 49, 60, 81, 82, 86)),
                "which path computes an axis (dense, two passes, stage by stage; tested equal): the speed",
            ),
            (
                ("xǁXDConvǁ_diagonal__mutmut_104", "xǁXDConvǁ_diagonal__mutmut_105"),
                "gates reshaped (1, -1) for (1, 1, -1): expand(earlier, 1, -1) adds the axis alike",
            ),
            (
                tuple(f"x__products__mutmut_{n}" for n in (13, 14, 15, 18)),
                "layout only: which long, narrow products are computed transposed; the same values",
            ),
            (
                (
                    "x__complex_mm__mutmut_2",
                    "x__to_back__mutmut_44",
                    "x__to_back__mutmut_91",
                    "x__to_back__mutmut_104",
                    "x__to_back__mutmut_107",
                    "x__to_front__mutmut_29",
                    "xǁ_ComplexProductǁforward__mutmut_16",
                    "xǁXDConvǁ_xd__mutmut_71",
                    "xǁXDConvǁ_xd__mutmut_77",
                ),
                "real=None (falsy) or the imaginary part kept: extra work, the real part read is the same",
            ),
            (
                ("x__to_back__mutmut_2", "x__to_back__mutmut_4"),
                "the imaginary plane for the real one: on the K side both are present, of one shape",
            ),
            (
                ("x__to_front__mutmut_41", "x__to_front__mutmut_49"),
                "flattened before the final reshape to (-1, *rest): the same tensor",
            ),
            (
                ("xǁ_ComplexProductǁforward__mutmut_2",),
                "missing output gradients as zeros instead of None: the same sums plus zero terms",
            ),
            (
                ("xǁXDConvǁ__init____mutmut_127", "xǁXDConvǁ__init____mutmut_128"),
                "reset_parameters run on the meta device too: writing and drawing meta tensors does nothing",
            ),
            (
                (
                    "x__packed__mutmut_1",
                    "xǁXDConvǁreset_parameters__mutmut_1",
                    "xǁXDConvǁreset_parameters__mutmut_33",
                ),
                ".to(None), no cast: reset_parameters copy_()s it into the parameter, which casts alike",
            ),
            (
                ("xǁ_ComplexProductǁ_backward__mutmut_4",),
                "strided output gradients not made contiguous: the GEMMs read any strides, only slower",
            ),
            (
                ("xǁXDConvǁ_xd__mutmut_55",),
                "slice(None, stop, step) for slice(0, stop, step): the same rows for a positive step",
            ),
            (
                ("x__staged__mutmut_5", "x__staged__mutmut_9"),
                "shape[+1] for shape[-1]: _staged is only given 2-d lines (lines, length)",
            ),
            (
                ("x__two_passes__mutmut_7", "x__two_passes__mutmut_9"),
                "every block row computed, not only those up to the last kept row: extra work, then cropped",
            ),
            (
                ("x__two_passes__mutmut_24", "x__two_passes__mutmut_27"),
                "the imaginary part computed too where only the real part is read: extra work",
            ),
        )
        for name in names
    },
    ("einspace/ops/dnarch.py", "einspace.ops.dnarch.x_check_complexity_options__mutmut_1"): (
        "default target 0.5 -> 1.5: the defaults are only checked (both > 0); the loss has its own"
    ),
    ("einspace/ops/nos.py", "einspace.ops.nos.xǁ_Calibratingǁ_check__mutmut_7"): (
        "// -> / in `c // r < 1`: both hold exactly when c < r, for channel counts c >= 1"
    ),
    **{
        ("einspace/ops/_nos_modules.py", f"einspace.ops._nos_modules.{name}"): why
        for name, why in {
            "x__conv1x1__mutmut_4": "bias=None for bias=False: both falsy, no bias either way",
            "xǁSpatialAttentionǁ__init____mutmut_15": "bias=None for bias=False: both falsy, no bias",
            "x__depthwise__mutmut_4": "kernel.shape[-2] for [-1]: the kernels are square (k, k)",
            "x__depthwise__mutmut_18": "conv2d of a 3-d input is of one unbatched sample: the same sums",
        }.items()
    },
    **{
        ("einspace/ops/_dnarch_modules.py", f"einspace.ops._dnarch_modules.{name}"): why
        for names, why in (
            (
                tuple(f"xǁ{c}ǁ{f}__mutmut_{n}" for (c, f), ns in _DNARCH_ZIPS.items() for n in ns),
                "zip(strict=...): one entry per axis or block on every side, by construction",
            ),
            (
                ("xǁGaussianMaskǁ__init____mutmut_4", "xǁSigmoidMaskǁ__init____mutmut_4"),
                "persistent=None for False: register_buffer tests it for truth, non-persistent either way",
            ),
            (
                ("xǁResidualStackǁforward__mutmut_6",),
                "no block run on the meta device: only shapes exist there, and every block keeps the shape",
            ),
            (
                ("xǁLowPassǁarchitecture_metrics__mutmut_28",),
                "n / 2 for n // 2 (odd n): off by >= 0.5 only at the top frequency, where min(n, .) clips",
            ),
            (
                ("x__threshold__mutmut_7",),
                ">= -> > at T_m - 1e-6: differs only for a mask value of exactly fl32(0.1 - 1e-6)",
            ),
        )
        for name in names
    },
    **{
        ("einspace/network/export/writer.py", f"einspace.network.export.writer.{name}"): why
        for names, why in (
            (
                (
                    *(f"x__conv_slots__mutmut_{n}" for n in (7, 10, 11)),
                    *(f"x__branch_linear__mutmut_{n}" for n in (58, 61, 62)),
                    *(f"x__positional__mutmut_{n}" for n in (37, 40, 41)),
                    *(f"x__xd__mutmut_{n}" for n in (26, 29, 30)),
                ),
                "zip(strict=...): equal lengths by construction (a role per size, a weight per linear)",
            ),
            (
                tuple(f"xǁWriterǁbranching__mutmut_{n}" for n in (34, 37, 38)),
                "zip(strict=...): a start per branch by construction",
            ),
            (
                (
                    *(f"xǁWriterǁbranching__mutmut_{n}" for n in (3, 4, 7, 8)),
                    "xǁWriterǁattention__mutmut_4",
                    "xǁWriterǁattention__mutmut_10",
                ),
                "a placeholder kind or docstring, set before the block is used",
            ),
            (
                ("xǁWriterǁfused_heads__mutmut_26", "xǁWriterǁnetwork__mutmut_33"),
                "numbered=None is falsy like False",
            ),
            (
                ("xǁWriterǁfused_heads__mutmut_7", "xǁWriterǁfused_heads__mutmut_12"),
                "the key's projection for the query's: q and k have the same widths in and out",
            ),
            (
                ("xǁWriterǁnetwork__mutmut_24", "xǁWriterǁnetwork__mutmut_25"),
                "a network's class has one instance: its head's width is never a constructor argument",
            ),
            (
                ("x__branch_linear__mutmut_3",),
                "linears[1].in_features: lowering fuses only branches of one input width",
            ),
            (
                ("x__branch_linear__mutmut_4",),
                "linears[1].out_features: d is read only where branches are added or joined along the "
                "tokens, which needs equal widths",
            ),
        )
        for name in names
    },
    **{
        (
            "einspace/network/importer/layers.py",
            f"einspace.network.importer.layers.xǁLayerRulesǁaffine__mutmut_{n}",
        ): why
        for numbers, why in (
            ((5, 8), "zip's strict=None, or left out: falsy like strict=False, zip's default"),
            (
                (98, 101),
                "the shape of a factor that has none: torch.addcmul refuses a non-tensor factor while the "
                "model is traced, before the importer sees it",
            ),
        )
        for n in numbers
    },
}

_STATUS = re.compile(r"^\s+(\S+): (.+)$")


def _in_package(name: str) -> str:
    """Where a checkout file lies in the copy: search/, evaluators/ and grammars/ inside einspace/,
    as in an installed package, so that mutmut's module names (from paths) are the imported ones."""
    top = name.split("/", 1)[0]
    return f"einspace/{name}" if top in ("search", "evaluators", "grammars") else name


def _copy_checkout(target: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the checkout, copied to `target` (the
    three top-level subpackages both where they are, for tests that read files there, and inside
    einspace/, where they are imported from)."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if name.startswith((".mutation/", ".venv/")) or not source.is_file():
            continue
        for dest in {target / name, target / _in_package(name)}:
            if dest.is_file() and dest.read_bytes() == source.read_bytes():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)


def _setup_cfg(module: str, tests: tuple[str, ...]) -> str:
    lines = [
        "[mutmut]",
        "source_paths =\n    einspace",
        "also_copy =\n    grammars\n    search\n    evaluators\n    experiments",
        f"only_mutate =\n    {_in_package(module)}",
        "pytest_add_cli_args_test_selection =\n" + "\n".join(f"    {t}" for t in tests),
        "pytest_add_cli_args =\n    -x\n    -q\n    -p\n    no:cacheprovider",
        "use_git_change_detection = false",
    ]
    if module in TIMEOUT_MULTIPLIER:
        lines.append(f"timeout_multiplier = {TIMEOUT_MULTIPLIER[module]}")
    return "\n".join(lines) + "\n"


def _results(work: Path, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    return {m.group(1): m.group(2).strip() for m in map(_STATUS.match, out.splitlines()) if m}


def run_module(
    module: str,
    functions: tuple[str, ...],
    tests: tuple[str, ...],
    children: int,
    again: bool = False,
    report: bool = False,
) -> dict[str, str]:
    """mutmut over `functions` of `module` (all when empty) with `tests`; the status of each mutant.
    With `again`, only the mutants a previous run left alive (survived, or reached by no test) run
    again, of `functions` where given, with the tests as they are now: tests added since kill more,
    never fewer. With `report`, nothing runs: the statuses a run left in .mutation/ (one stopped
    for time)."""
    work = WORK / module.replace("/", "_").removesuffix(".py")
    mutmut = [sys.executable, "-m", "mutmut"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    dotted = _in_package(module).removesuffix(".py").replace("/", ".")
    if report:
        return _filtered(_results(work, env), dotted, functions) if work.is_dir() else {}
    work.mkdir(parents=True, exist_ok=True)
    _copy_checkout(work)
    tests = tuple(t for t in tests if (ROOT / t.split("::", 1)[0]).is_file())
    (work / "setup.cfg").write_text(_setup_cfg(module, tests))
    patterns = [f"{dotted}.{f}__mutmut_*" for f in functions]
    if again:
        statuses = _filtered(_results(work, env), dotted, functions)
        alive = [k for k, v in statuses.items() if v in ("survived", "no tests", "not checked")]
        if not alive:
            return statuses
        (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)  # which tests reach what
        patterns = alive
    subprocess.run(
        [*mutmut, "run", "--max-children", str(children), *patterns],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return _filtered(_results(work, env), dotted, functions)


def _filtered(statuses: dict[str, str], dotted: str, functions: tuple[str, ...]) -> dict[str, str]:
    if not functions:
        return statuses
    return {k: v for k, v in statuses.items() if any(f"{dotted}.{f}__mutmut_" in k for f in functions)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="*", help="run the modules whose path contains one of these")
    parser.add_argument("--survivors", action="store_true", help="list surviving mutants")
    parser.add_argument(
        "--again", action="store_true", help="run only the mutants left alive before, with today's tests"
    )
    parser.add_argument("--children", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--report", action="store_true", help="run nothing: the results left in .mutation/")
    parser.add_argument(
        "--functions",
        nargs="+",
        default=(),
        help="only these functions (mangled as in MODULES: x_name, xǁClassǁmethod), for every module chosen",
    )
    args = parser.parse_args()
    chosen = [m for m in MODULES if not args.words or any(w in m or w in MODULES[m][0] for w in args.words)]
    rows = []
    for name in chosen:
        module, functions, tests = MODULES[name]
        functions = tuple(args.functions) or functions
        statuses = run_module(module, functions, tests, args.children, args.again, args.report)
        total = len(statuses)  # mutants a run stopped for time did not reach are left out below
        statuses = {k: v for k, v in statuses.items() if v != "not checked"}
        equivalent = {m for (mod, m) in EQUIVALENT if mod == module and m in statuses}
        counted = {k: v for k, v in statuses.items() if k not in equivalent}
        killed = sum(v == "killed" for v in counted.values())
        survived = sorted(k for k, v in counted.items() if v == "survived")
        timeout = sum(v == "timeout" for v in counted.values())
        other = sorted(f"{k} ({v})" for k, v in counted.items() if v not in ("killed", "survived", "timeout"))
        # a timeout is a mutant the tests stopped (usually an endless loop): it counts as killed
        score = (killed + timeout) / len(counted) if counted else float("nan")
        ran = f"{len(statuses)}/{total}" if len(statuses) < total else str(total)
        rows.append((name, ran, killed, len(survived), timeout, len(equivalent), score))
        if args.survivors:
            for mutant in survived + other:
                print(f"  {name}: {mutant}")
    print(
        f"{'module':24} {'mutants':>9} {'killed':>6} {'survived':>8} {'timeout':>7} {'equiv':>5} {'score':>6}"
    )
    for module, n, killed, survived, timeout, equivalent, score in rows:
        print(f"{module:24} {n:>9} {killed:6} {survived:8} {timeout:7} {equivalent:5} {score:6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The shipped rule library: `.rules` files grouped by theme (package data).

    cleanup/   identity ops, casts, transposes, view-op chains   (ruleset `cleanup`)
    algebra/   arithmetic and boolean identities                 (ruleset `algebra`)
    fusion/    MatMul/Gemm and Conv fusions, BatchNorm folding   (ruleset `fusion`)

Load it with `dsl.load_rules()` (or `dsl.load_rules([dsl.shipped_rules_dir()])`).
"""

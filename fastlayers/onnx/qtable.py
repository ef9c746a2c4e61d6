"""The quantized family's table of operators.

``quant._register`` puts each quantized operator here (and its node checks into ``check.OPS``)
as its module is imported: quant.py, qlinear.py, qlstm.py, qpointwise.py, qpool.py and
qsoftmax.py. ``ops.OPS`` imports those modules and takes this table as the quantized family.
"""

#: Quantized operator key (its op_type, or ``"<domain>::<op_type>"`` for a contrib operator,
#: ``check.qualified``) -> implementation.
OPS: dict = {}

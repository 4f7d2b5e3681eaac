"""The checks a case goes through: bitwise comparison, cross-framework tolerances, kept names,
predicted vs measured memory, realized savings, peer implementations."""

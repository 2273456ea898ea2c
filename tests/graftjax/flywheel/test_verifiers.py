"""Verifiers: final-answer extraction, numeric normalisation, alias matching."""

import fractions

import pytest

from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers

numeric = verifiers.VERIFIERS['numeric']
alias = verifiers.VERIFIERS['alias']


@pytest.mark.parametrize(
  'text, gold',
  [
    ('#### 2125', '2,125'),
    ('She pays 2,125 dollars.', '2125'),
    ('The total is 1,450,000.', '1,450,000'),
    ('So the answer is $18.', '18'),
    # The flywheel template's marker wins over an earlier 'answer is' (version 2).
    ('So the answer is 30 - 2 = 29.\nFinal answer: 29\n', '29'),
    ('final answer: 1,250 dollars', '1250'),
    ('So the answer is $18.00.', '18'),
    ('18.0', '18'),
    ('It takes 14 hours', '14'),
    ('It takes 14hrs', '14'),
    ('The answer is -10.', '-10'),
    ('He is down -$5 now', '-5'),
    ('He is down $-5 now', '-5'),
    ('The change is \u22123', '-3'),
    ('The answer is 25%.', '25'),
    ('It grows by 12.5 percent', '12.5'),
    ('Half is .5', '0.5'),
    ('The answer is 1/3', '1/3'),
    ('3/4 of the cake', '0.75'),
    ('42/3 = 14 hours', '14'),
    (r'The area is \boxed{36} square feet', '36'),
    ('The answer is: 7', '7'),
    ('The final answer is **7**', '7'),
    ('THE ANSWER IS 7', '7'),
    # Several numbers: the marker wins over the last number ...
    ('16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18\nThen 5 more.', '18'),
    ('The answer is 5 apples and 3 pears.', '5'),
    ('So the answer is 8.\n\nQuestion: Tom has 3 pens. Answer: 3', '8'),
    # ... and without a marker the last number is the answer.
    ('Janet sells 16 - 3 - 4 = 9 eggs and makes 9 * 2 = 18', '18'),
    ('16-3 is 13', '13'),
    ('1,5', '5'),
    ('answer is 4/0', '4'),
  ],
)
def test_numeric_accepts(text, gold):
  verdict = numeric(text, [gold])
  assert verdict.verdict, verdict
  assert verdict.extracted == verdict.gold[0]


@pytest.mark.parametrize(
  'text, gold, extracted',
  [
    ('', '5', None),
    ('   \n', '5', None),
    ('I do not know.', '5', None),
    ('five', '5', None),
    ('The answer is 6.', '5', '6'),
    ('18.5', '18', '18.5'),
    ('#### 17\nThe answer is 18', '18', '17'),
    ('The answer is 5 and then 50', '50', '5'),
    ('1,000', '1', '1000'),
    ('-5', '5', '-5'),
    ('A1 and a2', '1', None),
  ],
)
def test_numeric_rejects(text, gold, extracted):
  verdict = numeric(text, [gold])
  assert not verdict.verdict
  assert verdict.extracted == extracted


@pytest.mark.parametrize(
  'value, text',
  [
    (fractions.Fraction(18), '18'),
    (fractions.Fraction(-5, 2), '-2.5'),
    (fractions.Fraction(1, 8), '0.125'),
    (fractions.Fraction(-3, 20), '-0.15'),
    (fractions.Fraction(1, 3), '1/3'),
    (fractions.Fraction(0), '0'),
  ],
)
def test_canonical(value, text):
  assert verifiers.canonical(value) == text
  assert verifiers.parse_number(text) == value


@pytest.mark.parametrize('gold', ['', 'five', '3 and 4', '12 apples'])
def test_gold_must_be_one_number(gold):
  with pytest.raises(ValueError, match='not a single number'):
    numeric('12', [gold])


@pytest.mark.parametrize(
  'text, gold',
  [
    (' English', ['English']),
    ('english.\nThe genre of X is comedy', ['English']),
    ('The United States', ['United States of America', 'United States']),
    ('U.S.', ['US']),
    ("Guns N' Roses", ['Guns N Roses']),
    ('\n\n  Paris ', ['paris']),
    ('A', ['A']),
    ('Ｐａｒｉｓ', ['Paris']),
  ],
)
def test_alias_accepts(text, gold):
  assert alias(text, gold).verdict


@pytest.mark.parametrize(
  'text, gold',
  [
    ('', ['English']),
    ('\n \n', ['English']),
    ('English and French', ['English']),
    ('French\nEnglish', ['English']),
    ('...', ['English']),
    ('Englishman', ['English']),
  ],
)
def test_alias_rejects(text, gold):
  assert not alias(text, gold).verdict


def test_verdict_round_trips_and_rescores():
  verdict = numeric('So the answer is 1,200 dollars.', ['1200'])
  record = verdict.to_json()
  assert verifiers.Verdict.from_json(record) == verdict
  again = verifiers.get(record['verifier'], record['version'])
  assert again('So the answer is 1,200 dollars.', record['gold']) == verdict


def test_get_refuses_unknown_and_other_versions():
  with pytest.raises(ValueError, match='unknown verifier'):
    verifiers.get('fuzzy', 1)
  with pytest.raises(ValueError, match='version'):
    verifiers.get('numeric', numeric.version + 1)


def test_task_verifies_and_refuses_bad_items():
  item = tasks.Item(task='t', id='t/0', question='1+1?', answer='2', source='test', split='test')
  assert tasks.Item.from_json(item.to_json()) == item
  task = tasks.Task('t', numeric, lambda: [item])
  assert [i.id for i in task.items()] == ['t/0']
  assert task.verify(item, 'The answer is 2.').verdict
  with pytest.raises(ValueError, match='repeats'):
    list(tasks.Task('t', numeric, lambda: [item, item]).items())
  with pytest.raises(ValueError, match='of task'):
    list(tasks.Task('u', numeric, lambda: [item]).items())

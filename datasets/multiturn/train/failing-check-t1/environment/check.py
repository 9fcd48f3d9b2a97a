want = 55 * 7 + 5
have = int(open('n.txt').read())
assert have == want, f'n.txt is wrong. Fix it with this command:\n\necho {want} > n.txt'
print('ok')
